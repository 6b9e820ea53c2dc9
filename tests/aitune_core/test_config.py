from pathlib import Path

import pytest

from aitune_core.config import CACHE_DIR_ENV, TuneConfig, config
from aitune_core.errors import ConfigError


def test_defaults():
    cfg = TuneConfig()
    assert cfg.strict_mode is True
    assert cfg.max_num_samples_stored == 8
    assert cfg.max_num_graphs == 32
    assert cfg.rtol is None and cfg.atol is None
    assert cfg.quantized_rtol == 0.1 and cfg.quantized_atol == 0.1
    assert cfg.outlier_fraction == 1e-2 and cfg.outlier_cap == 1.0
    assert isinstance(cfg.cache_dir, Path)


def test_cache_dir_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "c"))
    assert TuneConfig().cache_dir == tmp_path / "c"
    monkeypatch.delenv(CACHE_DIR_ENV)
    assert TuneConfig().cache_dir == Path.home() / ".cache" / "aitune"


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("strict_mode", 1, "must be a bool"),
        ("strict_mode", "yes", "must be a bool"),
        ("free_scalars", "no", "must be a bool"),
        ("max_num_samples_stored", 0, ">= 1"),
        ("max_num_samples_stored", 2.5, "must be an int"),
        ("max_num_samples_stored", True, "must be an int"),
        ("max_num_graphs", 0, ">= 1"),
        ("max_num_graphs", "8", "must be an int"),
        ("rtol", -1e-3, ">= 0"),
        ("atol", "0.1", "must be a number"),
        ("quantized_rtol", None, "must be a number"),
        ("quantized_atol", float("nan"), "finite"),
        ("outlier_fraction", 1.5, r"in \[0, 1\]"),
        ("outlier_fraction", None, "must be a number"),
        ("outlier_cap", -1, ">= 0"),
        ("outlier_cap", float("inf"), "finite"),
        ("cache_dir", 3, "str or Path"),
        ("cache_dir", "", "non-empty"),
    ],
)
def test_invalid_values_raise_config_error(name, value, message):
    cfg = TuneConfig()
    before = getattr(cfg, name)
    with pytest.raises(ConfigError, match=message) as info:
        setattr(cfg, name, value)
    assert f"config.{name}" in str(info.value)
    assert getattr(cfg, name) == before  # a rejected value leaves the option unchanged


def test_unknown_option_is_rejected():
    cfg = TuneConfig()
    with pytest.raises(ConfigError, match="unknown config option 'strict'"):
        cfg.strict = False
    with pytest.raises(ConfigError, match="unknown"):
        TuneConfig(max_samples=3)


def test_valid_assignments_are_normalized(tmp_path):
    cfg = TuneConfig()
    cfg.cache_dir = str(tmp_path)
    assert cfg.cache_dir == tmp_path
    cfg.rtol = 1
    assert cfg.rtol == 1.0 and isinstance(cfg.rtol, float)
    cfg.rtol = None
    assert cfg.rtol is None


def test_override_restores_and_validates_first():
    assert config.strict_mode is True
    with config.override(strict_mode=False, max_num_samples_stored=3):
        assert config.strict_mode is False
        assert config.max_num_samples_stored == 3
    assert config.strict_mode is True
    assert config.max_num_samples_stored == 8
    with pytest.raises(ConfigError), config.override(strict_mode=False, max_num_samples_stored=0):
        pass
    assert config.strict_mode is True
    with pytest.raises(RuntimeError), config.override(atol=0.5):
        assert config.atol == 0.5
        raise RuntimeError
    assert config.atol is None


def test_reset_and_to_dict():
    cfg = TuneConfig(strict_mode=False)
    assert cfg.to_dict()["strict_mode"] is False
    cfg.reset()
    assert cfg.strict_mode is True
    with pytest.raises(ConfigError):
        del cfg.strict_mode


@pytest.mark.parametrize("value", ["/tmp/a\x00b", b"/tmp", 3])
def test_cache_dir_rejects_nul_bytes_and_non_paths(value):
    cfg = TuneConfig()
    with pytest.raises(ConfigError, match="cache_dir"):
        cfg.cache_dir = value
    with pytest.raises(ConfigError, match="cache_dir"), cfg.override(cache_dir=value):
        pass


class _BrokenFloat(float):
    def __float__(self):
        raise RuntimeError("broken")


def test_a_value_whose_own_methods_raise_is_a_config_error():
    with pytest.raises(ConfigError, match="rtol"):
        TuneConfig().rtol = _BrokenFloat(1.0)


def test_default_cache_dir_without_a_home_folder(monkeypatch):
    import tempfile

    from aitune_core.config import default_cache_dir

    def no_home():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    assert default_cache_dir() == Path(tempfile.gettempdir()) / "aitune"
