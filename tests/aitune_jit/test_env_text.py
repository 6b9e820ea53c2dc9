"""The parsers of `AITUNE_JIT_*` variable text: values they accept, and a ConfigError naming what they expected."""

from __future__ import annotations

import pytest

from aitune_core.backends.torch_eager import TorchEagerBackend
from aitune_core.errors import ConfigError
from aitune_jit.env_text import env_backends, env_bool, env_int, env_list, env_optional, env_optional_float


@pytest.mark.parametrize("text,value", [("1", True), (" Yes ", True), ("on", True), ("0", False), ("OFF", False)])
def test_env_bool_accepts_the_usual_spellings(text: str, value: bool) -> None:
    assert env_bool(text) is value


def test_env_bool_refuses_other_text() -> None:
    with pytest.raises(ConfigError, match="expected a boolean"):
        env_bool("maybe")


def test_env_int_and_optional_float() -> None:
    assert env_int(" 3 ") == 3
    with pytest.raises(ConfigError, match="expected an integer"):
        env_int("3.5")
    assert env_optional_float("none") is None and env_optional_float("") is None
    assert env_optional_float("2.5") == 2.5
    with pytest.raises(ConfigError, match="expected a number"):
        env_optional_float("fast")


def test_env_list_and_optional_strip_blanks() -> None:
    assert env_list(" A, ,B ,") == ["A", "B"]
    assert env_optional(" None ") is None
    assert env_optional(" cuda:1 ") == "cuda:1"


def test_env_backends_builds_registered_classes_and_names_unknown_ones() -> None:
    backends = env_backends("TorchEagerBackend")
    assert len(backends) == 1 and isinstance(backends[0], TorchEagerBackend)
    with pytest.raises(ConfigError, match="NoSuchBackend"):
        env_backends("NoSuchBackend")
