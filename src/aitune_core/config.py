"""The tuning configuration shared by ahead-of-time and just-in-time modes.

`config` is the one process-wide instance (re-exported as `aitune.torch.config`). Every attribute is
validated when it is assigned, so a typo or a wrong type fails at the line that caused it:

    config.strict_mode = False              # only tensors decide graph identity
    config.max_num_samples_stored = 4       # samples kept per graph (memory bound)
    config.cache_dir = "/tmp/aitune"        # str or Path; `~` is expanded
    config.unknown = 1                      # ConfigError: unknown option

Options:

- `strict_mode` (bool, default True): when True, non-tensor arguments (strings, flags, ...) are
  part of a graph's identity, so `m(x, mask=True)` and `m(x, mask=False)` are different graphs, except an int
  or float whose value changes between otherwise equal calls (`m(x, t=999)`, `m(x, t=979)`): that one becomes a
  free scalar of one graph (`aitune_core.specs.free_scalars`); when False only the structure and the tensors
  (rank, dtype) decide.
- `free_scalars` (bool, default True): in strict mode, an int or float whose value changes between otherwise equal
  calls joins one graph as a free scalar. False: every value is a graph of its own, as before free scalars (for a
  flat-graph backend - ONNX Runtime, TensorRT - that bakes each value in, with few values).
- `max_num_samples_stored` (int >= 1, default 8): samples kept per graph; the store keeps the calls
  at the shape extremes so min and max shapes can be validated.
- `max_num_graphs` (int >= 1, default 32): graphs recorded per module. In strict mode a non-tensor argument
  that changes on every call (a request id, a string) would otherwise make a new graph, with its
  samples, on every call: unbounded memory in a long-running server. Calls of graphs beyond the limit run
  the original module and are not recorded (one warning per module).
- `cache_dir` (Path, default `$AITUNE_CACHE_DIR` or `~/.cache/aitune`): where backends put artifacts.
- `rtol`, `atol` (float >= 0 or None, default None): validation tolerances; None means the
  dtype-aware defaults of `aitune_core.validation.tolerance`.
- `quantized_rtol`, `quantized_atol` (float >= 0, default 0.1 / 0.1): the widened tolerances that
  quantized backends (int8 / fp8 / weight-only) validate with, since they change the numbers on purpose.
- `outlier_fraction` (float in [0, 1], default 1e-2): the fraction of a floating output tensor's elements that may
  be outside the element-wise tolerance when the whole tensor is close (see `aitune_core.validation.criterion`);
  0 makes every element meet the element-wise tolerance.
- `outlier_cap` (float >= 0, default 1.0): no element's error may exceed `outlier_cap * (atol + rtol * max|ref|)`,
  so a backend wrong in a few elements by a lot is still rejected.

`config.override(**options)` is a context manager that sets options for a block and restores them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aitune_core.errors import ConfigError

CACHE_DIR_ENV = "AITUNE_CACHE_DIR"


def default_cache_dir() -> Path:
    """`$AITUNE_CACHE_DIR` when set, else `~/.cache/aitune` (the temporary folder when there is no home folder:
    importing aitune must not fail on the environment)."""
    env = os.environ.get(CACHE_DIR_ENV)
    try:
        return Path(env).expanduser() if env else Path.home() / ".cache" / "aitune"
    except RuntimeError:  # no home folder (no $HOME and no password entry)
        import tempfile

        return Path(tempfile.gettempdir()) / "aitune"


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"config.{name} must be a bool (True/False), got {value!r} of type {type(value).__name__}")
    return value


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"config.{name} must be an int, got {value!r} of type {type(value).__name__}")
    if value < 1:
        raise ConfigError(f"config.{name} must be >= 1, got {value}")
    return value


def _tolerance(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"config.{name} must be a number >= 0, got {value!r} of type {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"config.{name} must be a finite number >= 0, got {value}")
    return value


def _fraction(name: str, value: Any) -> float:
    value = _tolerance(name, value)
    if value > 1:
        raise ConfigError(f"config.{name} must be a fraction in [0, 1], got {value}")
    return value


def _optional_tolerance(name: str, value: Any) -> float | None:
    return None if value is None else _tolerance(name, value)


def _path(name: str, value: Any) -> Path:
    if not isinstance(value, (str, os.PathLike)) or isinstance(os.fspath(value), bytes) or str(value) == "":
        raise ConfigError(f"config.{name} must be a non-empty str or Path, got {value!r}")
    if "\x00" in str(value):
        raise ConfigError(f"config.{name} must not contain a NUL character, got {value!r}")
    return Path(value).expanduser()


def _validated(name: str, validator: Callable[[str, Any], Any], value: Any) -> Any:
    """`validator(name, value)`, with anything else than ConfigError (a value whose own methods fail) reported
    as a ConfigError too: every setter fails the same way."""
    try:
        return validator(name, value)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"config.{name}: cannot use {value!r}: {type(exc).__name__}: {exc}") from exc


# name -> (validator, default factory)
_OPTIONS: dict[str, tuple[Callable[[str, Any], Any], Callable[[], Any]]] = {
    "strict_mode": (_bool, lambda: True),
    "free_scalars": (_bool, lambda: True),
    "max_num_samples_stored": (_positive_int, lambda: 8),
    "max_num_graphs": (_positive_int, lambda: 32),
    "cache_dir": (_path, default_cache_dir),
    "rtol": (_optional_tolerance, lambda: None),
    "atol": (_optional_tolerance, lambda: None),
    "quantized_rtol": (_tolerance, lambda: 0.1),
    "quantized_atol": (_tolerance, lambda: 0.1),
    "outlier_fraction": (_fraction, lambda: 1e-2),  # = validation.criterion.DEFAULT_OUTLIER_FRACTION (why: there)
    "outlier_cap": (_tolerance, lambda: 1.0),
}


class TuneConfig:
    """Validated tuning options; see the module docstring for each option."""

    strict_mode: bool
    free_scalars: bool
    max_num_samples_stored: int
    max_num_graphs: int
    cache_dir: Path
    rtol: float | None
    atol: float | None
    quantized_rtol: float
    quantized_atol: float
    outlier_fraction: float
    outlier_cap: float

    def __init__(self, **options: Any) -> None:
        for name, (_validator, default) in _OPTIONS.items():
            setattr(self, name, default())
        for name, value in options.items():
            setattr(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        option = _OPTIONS.get(name)
        if option is None:
            known = ", ".join(_OPTIONS)
            raise ConfigError(f"unknown config option {name!r}; known options: {known}")
        object.__setattr__(self, name, _validated(name, option[0], value))

    def __delattr__(self, name: str) -> None:
        raise ConfigError(f"config options cannot be deleted ({name!r}); assign a value instead")

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _OPTIONS}

    def reset(self) -> None:
        """Restore every option to its default (re-reading `$AITUNE_CACHE_DIR`)."""
        for name, (_validator, default) in _OPTIONS.items():
            setattr(self, name, default())

    @contextmanager
    def override(self, **options: Any) -> Iterator[TuneConfig]:
        """Set options for the duration of a block; the previous values come back afterwards.

        Values are validated before anything changes, so a bad option leaves the config untouched.
        """
        for name, value in options.items():
            option = _OPTIONS.get(name)
            if option is None:
                raise ConfigError(f"unknown config option {name!r}; known options: {', '.join(_OPTIONS)}")
            _validated(name, option[0], value)
        saved = {name: getattr(self, name) for name in options}
        try:
            for name, value in options.items():
                setattr(self, name, value)
            yield self
        finally:
            for name, value in saved.items():
                object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items())
        return f"TuneConfig({inner})"


config = TuneConfig()
