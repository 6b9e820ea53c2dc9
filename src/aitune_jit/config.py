"""`jit_config`: the options of just-in-time tuning, validated when they are assigned.

    from aitune.torch import jit_config
    jit_config.min_samples = 2             # recorded calls of a graph before it is tuned
    jit_config.device = "cuda:7"           # ConfigError at this line when there is no such GPU

Options (default in brackets; each can also be given as an environment variable `AITUNE_JIT_<NAME>`, read
once, when aitune_jit is first imported, e.g. `AITUNE_JIT_MIN_SAMPLES=3`, `AITUNE_JIT_BACKENDS=TorchEagerBackend`).
A variable whose value cannot be used is reported by one WARNING (variable, value, what is accepted) and its
option keeps its default; an `AITUNE_JIT_*` name that is no option gets one WARNING naming the closest known
name. Reading the environment never raises: in env-var mode the program must run whatever is set. Assigning
in code is strict instead: every setter raises ConfigError for a wrong type or value.

- `min_samples` [2]: recorded calls of one graph (input structure) before that graph is tuned.
- `min_samples_varying` [8]: recorded calls before a graph is tuned when a non-batch axis of its inputs varied
  among them (a sequence length): its shape ranges come from those calls, and two calls of a server's lengths
  (32..128) gave a range that later calls fell outside of, then a second compile. Not for a node whose calls
  change their arguments (a KV cache): each recorded call copies them on the serving thread.
- `batch_axis_required` [False]: when True, a graph is tuned only once its recordings show a batch axis
  (the leading dimension varies between calls); until then the module keeps recording.
- `max_depth_level` [2]: deepest level of the call tree whose modules may be tuned (root = 0).
- `min_parameters` [1000]: modules with fewer parameters are SKIPPED (their children may still be tuned).
- `detect_graph_breaks` [True]: a module with a graph break stays EAGER and its children become candidates.
  With the default strategy the Inductor candidates compile with `fullgraph=True`, so the first compile finds a
  break itself and dynamo explains one recorded call only when it failed; with other backends the explanation
  runs before tuning (`aitune_jit.tuner`).
- `skip_modules` [[]]: class names that are never tuned (SKIPPED; their children may still be tuned).
- `device` [None]: device to tune on; None means the device of the module's parameters (CPU without any).
- `dry_run` [False]: log what would be tuned (graph-break checks included) and change nothing.
- `backends` [None]: list of `Backend` candidates; None means `default_backends(device)` (TensorRT when
  importable, Inductor with CUDA graphs on CUDA, Inductor).
- `strategy` [None]: a `TuneStrategy`; None means `FirstWinsStrategy(backends)` when `backends` is set,
  else `default_strategy(device)`: `HighestThroughputStrategy` over `default_backends(device)`, measuring
  each candidate against eager at the recorded shapes in interleaved rounds (medians), on every device.
- `cache_dir` [`$AITUNE_JIT_CACHE_DIR`, else `<aitune cache>/jit`]: tuning decisions (JSON, shared by later
  runs and by processes using the same folder) and backend artifacts; see `aitune_jit.decisions`.
- `reuse_decisions` [True]: identical modules and later runs reuse tuning decisions (`aitune_jit.decisions`).
- `wait_for_replicas` [True]: a graph another live process sharing `cache_dir` is tuning runs eagerly here until
  that process's decision is stored, then reuses it (`aitune_jit.replica_claims`); False: tune it here too.
- `blocking` [False]: tune in the call that completes `min_samples`, not on the worker (`aitune_jit.worker`);
  `tuning_timeout_s` [600]: a worker job still running after this long leaves its module eager (None or inf: never).
- `precision` [None]: None, "bf16" or "fp16"; adds autocast Inductor candidates to the default backends,
  validated with the tolerance of that dtype (opt-in: it changes numerics within that tolerance).
- `min_speedup` [None: 1.05 on the CPU, 1.02 on CUDA]: the default strategy keeps a module eager unless a
  candidate is at least this many times faster than eager (interleaved medians at the recorded shapes), and
  stops trying candidates once one is. Must be >= 1.
- `min_eager_latency_us` [None: 50 on the CPU, 20 on CUDA]: the default strategy builds nothing for a module
  whose eager call at the recorded shapes takes less (microseconds): a tiny Embedding, Linear or LayerNorm
  is not worth a tuned call's dispatch. 0 turns the check off.
- `skip_single_layer` [True]: the default strategy builds nothing for a module that is one torch.nn layer
  (Linear, Embedding, LayerNorm, Conv2d, ..., or a module whose only submodule is one): a compiler runs the
  same library kernel for it, so it could only lose by the dispatch; this saves its compile.
- `retune_after_misses` [8]: after this many calls of a tuned graph (same structure) fall outside its tuned shape
  ranges and run eagerly, the graph is tuned again over the ranges seen since (at most
  `range_growth.MAX_RETUNES` times per graph); 0 never re-tunes.
- `range_headroom` [True]: a graph whose sizes varied is served over the powers of two around its recorded range
  (recorded [35, 57] serves [32, 64]; `aitune_core.specs.range_headroom`); False: the recorded range only.
- `stateful_calls` [True]: a module whose forward changes its arguments (a decoder appending to its KV cache) is
  recorded on copies of its arguments taken before each call and tuned, its backends validated on the state each
  call leaves behind (`aitune_core.recording.sample`); False: such a module stays eager.
- `tuning_budget_s` [None]: seconds this process may spend tuning in all; once spent, modules not tuned yet stay
  eager (the history says so). None: no limit.

`default_backends` and `default_strategy` are defined once, in `aitune_core.backends.defaults` and
`aitune_core.strategies.defaults`; AOT tuning uses the same ones.
"""

from __future__ import annotations

import difflib
import logging
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from aitune_core.backends.backend import Backend, BackendState
from aitune_core.backends.defaults import PRECISION_DTYPES, default_backends, tensorrt_available
from aitune_core.device_check import unavailable
from aitune_core.errors import ConfigError
from aitune_core.log import warn_visibly
from aitune_core.strategies.defaults import CUDA_EARLY_STOP_SPEEDUP
from aitune_jit.env_text import env_backends, env_bool, env_int, env_list, env_optional, env_optional_float

if TYPE_CHECKING:
    from aitune_core.strategies.strategy import TuneStrategy

_logger = logging.getLogger("aitune.jit")

CACHE_DIR_ENV = "AITUNE_JIT_CACHE_DIR"
ENV_PREFIX = "AITUNE_JIT_"
PRECISIONS = tuple(PRECISION_DTYPES)

__all__ = [
    "CUDA_EARLY_STOP_SPEEDUP",
    "JitConfig",
    "default_backends",
    "default_cache_dir",
    "default_strategy",
    "jit_config",
    "tensorrt_available",
    "validate_device",
]
#: `AITUNE_JIT_*` variables that are not options (read by `aitune_jit.summary` at exit)
OTHER_ENV_NAMES = ("AITUNE_JIT_PRINT_HIERARCHY", "AITUNE_JIT_PRINT_HISTORY")
#: (variable, value) pairs already reported: each bad or unknown variable is reported once per process
_reported: set[tuple[str, str]] = set()


# ----------------------------------------------------------------------------------------------- validators
def _non_negative_int(name: str, value: Any, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"jit_config.{name} must be an int, got {value!r} of type {type(value).__name__}")
    if value < minimum:
        raise ConfigError(f"jit_config.{name} must be >= {minimum}, got {value}")
    return value


def _min_samples(name: str, value: Any) -> int:
    return _non_negative_int(name, value, minimum=1)


def _optional_number(name: str, value: Any, minimum: float = 0.0, *, unlimited: bool = False) -> float | None:
    """A finite number >= `minimum`, or None; with `unlimited` (a time limit), infinity is None: no limit (an
    infinite timeout overflowed the worker's waits and nothing was tuned, without a word)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"jit_config.{name} must be a number or None, got {value!r} of type {type(value).__name__}")
    if math.isnan(value):
        raise ConfigError(f"jit_config.{name} must be a number or None, got nan")
    if math.isinf(value) and value > 0:
        if unlimited:
            return None
        raise ConfigError(f"jit_config.{name} must be finite, got {value}")
    if value < minimum:
        raise ConfigError(f"jit_config.{name} must be >= {minimum:g}, got {value}")
    return float(value)


def _min_speedup(name: str, value: Any) -> float | None:
    return _optional_number(name, value, minimum=1.0)


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"jit_config.{name} must be True or False, got {value!r} of type {type(value).__name__}")
    return value


def _skip_modules(name: str, value: Any) -> list[str]:
    if isinstance(value, str) or not isinstance(value, (list, tuple, set, frozenset)):
        raise ConfigError(f"jit_config.{name} must be a list of class names, got {value!r}")
    names = []
    for item in value:
        if isinstance(item, type):
            item = item.__name__
        if not isinstance(item, str) or not item:
            raise ConfigError(f"jit_config.{name} must hold class names (str), got {item!r}")
        names.append(item)
    return names


def validate_device(name: str, value: Any) -> torch.device | None:
    """A device that exists on this machine, or None; otherwise a ConfigError saying why."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, torch.device)):
        raise ConfigError(
            f"jit_config.{name} must be None, a str such as 'cuda:0', an int or a torch.device, "
            f"got {value!r} of type {type(value).__name__}"
        )
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise ConfigError(f"jit_config.{name}: {value!r} is not a device ({exc})") from exc
    reason = unavailable(device)
    if reason is not None:
        raise ConfigError(f"jit_config.{name} = {value!r}, but {reason}")
    return device


def _backends(name: str, value: Any) -> list[Backend] | None:
    if value is None:
        return None
    if isinstance(value, Backend):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"jit_config.{name} must be a list of Backend instances, got {type(value).__name__}")
    if not value:
        raise ConfigError(f"jit_config.{name} is empty; set None for the default backends")
    for item in value:
        if isinstance(item, type) and issubclass(item, Backend):
            raise ConfigError(f"jit_config.{name}: pass an instance, e.g. {item.__name__}(), not the class")
        if not isinstance(item, Backend):
            raise ConfigError(
                f"jit_config.{name} must hold Backend instances (e.g. TorchInductorBackend()), "
                f"got {item!r} of type {type(item).__name__}"
            )
        if item.state is not BackendState.INIT:
            raise ConfigError(f"jit_config.{name}: {item.describe()} is {item.state.name}; pass unbuilt backends")
    return list(value)


def _strategy(name: str, value: Any) -> TuneStrategy | None:
    if value is None:
        return None
    from aitune_core.strategies.strategy import TuneStrategy

    if not isinstance(value, TuneStrategy):
        raise ConfigError(f"jit_config.{name} must be a TuneStrategy instance or None, got {type(value).__name__}")
    return value


def _path(name: str, value: Any) -> Path:
    if not isinstance(value, (str, os.PathLike)) or isinstance(os.fspath(value), bytes) or str(value) == "":
        raise ConfigError(f"jit_config.{name} must be a non-empty str or Path, got {value!r}")
    if "\x00" in str(value):
        raise ConfigError(f"jit_config.{name} must not contain a NUL character, got {value!r}")
    return Path(value).expanduser()


def _precision(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if value == torch.bfloat16:
        return "bf16"
    if value == torch.float16:
        return "fp16"
    if isinstance(value, str) and value.lower() in PRECISIONS:
        return value.lower()
    raise ConfigError(f"jit_config.{name} must be None, 'bf16' or 'fp16', got {value!r}")


def default_cache_dir() -> Path:
    """`$AITUNE_JIT_CACHE_DIR` when set, else `<aitune core cache_dir>/jit`."""
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env).expanduser()
    from aitune_core.config import config

    return Path(config.cache_dir) / "jit"


# name -> (validator, default factory, parser of the environment variable's text or None)
_OPTIONS: dict[str, tuple[Callable[[str, Any], Any], Callable[[], Any], Callable[[str], Any] | None]] = {
    "min_samples": (_min_samples, lambda: 2, env_int),
    "min_samples_varying": (_min_samples, lambda: 8, env_int),
    "batch_axis_required": (_bool, lambda: False, env_bool),
    "max_depth_level": (_non_negative_int, lambda: 2, env_int),
    "min_parameters": (_non_negative_int, lambda: 1000, env_int),
    "detect_graph_breaks": (_bool, lambda: True, env_bool),
    "skip_modules": (_skip_modules, list, env_list),
    "device": (validate_device, lambda: None, env_optional),
    "dry_run": (_bool, lambda: False, env_bool),
    "backends": (_backends, lambda: None, env_backends),
    "strategy": (_strategy, lambda: None, None),
    "cache_dir": (_path, default_cache_dir, str),
    "precision": (_precision, lambda: None, env_optional),
    "min_speedup": (_min_speedup, lambda: None, env_optional_float),
    "min_eager_latency_us": (_optional_number, lambda: None, env_optional_float),
    "skip_single_layer": (_bool, lambda: True, env_bool),
    "reuse_decisions": (_bool, lambda: True, env_bool),
    "wait_for_replicas": (_bool, lambda: True, env_bool),
    "blocking": (_bool, lambda: False, env_bool),
    "tuning_timeout_s": (lambda name, value: _optional_number(name, value, 0.001, unlimited=True), lambda: 600.0,
                         env_optional_float),
    "retune_after_misses": (_non_negative_int, lambda: 8, env_int),
    "tuning_budget_s": (lambda name, value: _optional_number(name, value, unlimited=True), lambda: None,
                        env_optional_float),
    "range_headroom": (_bool, lambda: True, env_bool),
    "stateful_calls": (_bool, lambda: True, env_bool),
}


#: what each option accepts from its environment variable (for the warning about a value that cannot be used)
_BOOL_TEXT = "a boolean (1/0, true/false, yes/no, on/off)"
_ACCEPTED: dict[str, str] = {
    "min_samples": "an integer >= 1",
    "min_samples_varying": "an integer >= 1",
    "max_depth_level": "an integer >= 0",
    "min_parameters": "an integer >= 0",
    "skip_modules": "comma-separated class names",
    "device": "none or a device of this machine (cpu, cuda, cuda:1, ...)",
    "backends": "comma-separated backend class names (e.g. TorchInductorBackend,TorchEagerBackend)",
    "strategy": "nothing (set jit_config.strategy in code)",
    "cache_dir": "a folder path",
    "precision": "none, bf16 or fp16",
    "tuning_timeout_s": "none or a number of seconds > 0",
    "retune_after_misses": "an integer >= 0",
    "tuning_budget_s": "none or a number of seconds >= 0",
}


def _accepted(name: str) -> str:
    return _ACCEPTED.get(name) or (_BOOL_TEXT if _OPTIONS[name][0] is _bool else f"a valid jit_config.{name}")


def _report_once(variable: str, text: str, message: str, *args: Any) -> None:
    key = (variable, text)
    if key in _reported:
        return
    _reported.add(key)
    warn_visibly(_logger, message, *args)


def _check_env_names(environ: Any) -> None:
    """One WARNING per `AITUNE_JIT_*` variable that is no option, naming the closest known name."""
    known = sorted([ENV_PREFIX + name.upper() for name in _OPTIONS] + list(OTHER_ENV_NAMES))
    for variable in sorted(k for k in environ if isinstance(k, str) and k.startswith(ENV_PREFIX)):
        if variable in known:
            continue
        close = difflib.get_close_matches(variable, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else f"known names: {', '.join(known)}"
        _report_once(variable, "", "%s is not an aitune JIT option and is ignored; %s", variable, hint)


class JitConfig:
    """Validated JIT options (see the module docstring); `jit_config` is the process-wide instance."""

    min_samples: int
    min_samples_varying: int
    batch_axis_required: bool
    max_depth_level: int
    min_parameters: int
    detect_graph_breaks: bool
    skip_modules: list[str]
    device: torch.device | None
    dry_run: bool
    backends: list[Backend] | None
    strategy: TuneStrategy | None
    cache_dir: Path
    precision: str | None
    min_speedup: float | None
    min_eager_latency_us: float | None
    skip_single_layer: bool
    reuse_decisions: bool
    wait_for_replicas: bool
    blocking: bool
    tuning_timeout_s: float | None
    retune_after_misses: int
    tuning_budget_s: float | None
    range_headroom: bool
    stateful_calls: bool

    def __init__(self, *, read_env: bool = True, **options: Any) -> None:
        self.reset(read_env=read_env)
        for name, value in options.items():
            setattr(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        option = _OPTIONS.get(name)
        if option is None:
            raise ConfigError(f"unknown jit_config option {name!r}; known options: {', '.join(_OPTIONS)}")
        object.__setattr__(self, name, _validated(name, option[0], value))

    def __delattr__(self, name: str) -> None:
        raise ConfigError(f"jit_config options cannot be deleted ({name!r}); assign a value instead")

    def reset(self, *, read_env: bool = True) -> None:
        """Every option back to its default, then the `AITUNE_JIT_*` environment variables when `read_env`."""
        for name, (_validator, default, _parser) in _OPTIONS.items():
            setattr(self, name, default())
        if read_env:
            self._read_env()

    def _read_env(self) -> None:
        """Apply the `AITUNE_JIT_*` variables; never raises (see the module docstring)."""
        environ = dict(os.environ)
        for name, (_validator, _default, parser) in _OPTIONS.items():
            variable = ENV_PREFIX + name.upper()
            text = environ.get(variable)
            if text is None:
                continue
            if parser is None:
                _report_once(variable, text, "%s is ignored: `%s` takes an object; set jit_config.%s in code",
                             variable, name, name)
                continue
            try:
                setattr(self, name, parser(text))
            except Exception as exc:  # the option keeps its default
                _report_once(
                    variable, text, "%s=%r is ignored (%s); accepted: %s. jit_config.%s keeps its default %r.",
                    variable, text, exc, _accepted(name), name, getattr(self, name),
                )
        _check_env_names(environ)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _OPTIONS}

    @contextmanager
    def override(self, **options: Any) -> Iterator[JitConfig]:
        """Set options for a block; the previous values come back afterwards (all validated first)."""
        saved = self.to_dict()
        validated = {}
        for name, value in options.items():
            option = _OPTIONS.get(name)
            if option is None:
                raise ConfigError(f"unknown jit_config option {name!r}; known options: {', '.join(_OPTIONS)}")
            validated[name] = _validated(name, option[0], value)
        try:
            for name, value in validated.items():
                object.__setattr__(self, name, value)
            yield self
        finally:
            for name, value in saved.items():
                object.__setattr__(self, name, value)

    def validate(self) -> None:
        """Re-check every option (called when tuning starts: a GPU may have gone, an option may have been
        put in place behind the setter's back)."""
        for name, (validator, _default, _parser) in _OPTIONS.items():
            validator(name, getattr(self, name))

    def resolve_strategy(self, device: torch.device) -> TuneStrategy:
        """The strategy tuning uses: `strategy`, else FirstWins over `backends`, else `default_strategy`."""
        if self.strategy is not None:
            return self.strategy
        if self.backends is not None:
            from aitune_core.strategies.first_wins import FirstWinsStrategy

            # the strategy copies each blueprint per candidate, inside the candidate's try: a backend that cannot be
            # copied is a failed candidate, not an error in the user's call
            return FirstWinsStrategy(list(self.backends))
        return default_strategy(
            device,
            precision=self.precision,
            min_speedup=self.min_speedup,
            min_eager_latency_us=self.min_eager_latency_us,
            skip_single_layer=self.skip_single_layer,
            fullgraph=self.detect_graph_breaks,
        )

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items())
        return f"JitConfig({inner})"


def _validated(name: str, validator: Callable[[str, Any], Any], value: Any) -> Any:
    """`validator(name, value)`; anything it raises other than ConfigError (a value whose own methods fail) is
    reported as a ConfigError too."""
    try:
        return validator(name, value)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"jit_config.{name}: cannot use {value!r}: {type(exc).__name__}: {exc}") from exc


# ----------------------------------------------------------------------------------------------- defaults
def default_strategy(
    device: torch.device | str | None = None,
    precision: str | None = None,
    *,
    min_speedup: float | None = None,
    min_eager_latency_us: float | None = None,
    skip_single_layer: bool = True,
    fullgraph: bool = False,
) -> TuneStrategy:
    """The strategy used when neither `jit_config.strategy` nor `jit_config.backends` is set: the core default
    (`aitune_core.strategies.defaults.default_strategy`, measuring speed on every device), with this module's
    `CUDA_EARLY_STOP_SPEEDUP` (re-exported here so that benchmarks can change it for the JIT). `resolve_strategy`
    passes `fullgraph=detect_graph_breaks`: the first compile then finds a graph break itself (`aitune_jit.tuner`)."""
    from aitune_core.strategies.defaults import default_strategy as core_default_strategy

    return core_default_strategy(
        device,
        precision,
        min_speedup=min_speedup,
        min_eager_latency_us=min_eager_latency_us,
        cuda_early_stop=CUDA_EARLY_STOP_SPEEDUP,
        skip_single_layer=skip_single_layer,
        fullgraph=fullgraph,
    )


jit_config = JitConfig()
