"""Backend base class: one technology for running a module, guarded by a small state machine.

The state machine exists so that a strategy, a checkpoint loader and the dispatcher can never use a
backend in a state where it would silently compute garbage (e.g. infer before build, or re-build a
deployed engine). Every illegal transition raises `BackendStateError` naming the current state.

    INIT --build()--> ACTIVE <--deactivate()/activate()--> INACTIVE
    CHECKPOINT_LOADED --activate()--> ACTIVE ; CHECKPOINT_LOADED --deploy()--> DEPLOYED (final)
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import gc
import hashlib
import json
import logging
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from aitune_core.errors import BackendBuildError, BackendStateError
from aitune_core.specs.replay_state import replaying

if TYPE_CHECKING:
    from aitune_core.recording.sample import Sample
    from aitune_core.specs.graph_spec import GraphSpec
    from aitune_core.validation.tolerance import Tolerance

_logger = logging.getLogger("aitune.backend")


class BackendState(enum.Enum):
    INIT = "init"
    ACTIVE = "active"
    INACTIVE = "inactive"
    CHECKPOINT_LOADED = "checkpoint_loaded"
    DEPLOYED = "deployed"


def to_jsonable(value: Any) -> Any:
    """Canonical JSON form of config values, so keys are stable across processes."""
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, torch.device):
        return str(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"__class__": type(value).__name__, **{f.name: to_jsonable(getattr(value, f.name))
                                                      for f in dataclasses.fields(value)}}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def _format_value(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return f"{type(value).__name__}()" if not _changed_fields(value) else (
            f"{type(value).__name__}({', '.join(_changed_fields(value))})")
    return str(value)


def _changed_fields(obj: Any) -> list[str]:
    """`name=value` for every dataclass field that differs from its default."""
    out = []
    for f in dataclasses.fields(obj):
        if not f.repr:
            continue
        value = getattr(obj, f.name)
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        else:
            out.append(f"{f.name}={_format_value(value)}")
            continue
        try:
            same = bool(value == default)
        except Exception:  # e.g. tensors or third-party configs with odd __eq__
            same = value is default
        if not same:
            out.append(f"{f.name}={_format_value(value)}")
    return out


@dataclasses.dataclass(frozen=True)
class BackendConfig:
    """Base of backend configurations: small frozen dataclasses, validated in `__post_init__`."""

    def describe(self) -> str:
        """Only the fields that differ from defaults, comma separated (as in the tuning logs)."""
        return ",".join(_changed_fields(self))

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> BackendConfig:
        """A configuration read back from a file (a checkpoint, a JIT decision): built, then `check_from_file`."""
        config = cls(**state)
        config.check_from_file()
        return config

    def check_from_file(self) -> None:
        """Raise `ValueError` for a value that is fine in a script but not from a file (one that could name code
        to run); every field here is plain data unless a subclass says otherwise."""

    def key(self) -> str:
        """Stable across processes: sha256 of the canonical JSON of the config."""
        payload = json.dumps(to_jsonable(self.to_dict()), sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


class Backend(ABC):
    """A way to run one module for one graph. Strategies deep-copy a blueprint per module and graph."""

    STATE_TYPE: ClassVar[str] = "type"
    STATE_CONFIG: ClassVar[str] = "config"
    config_class: ClassVar[type[BackendConfig]] = BackendConfig
    #: whether a checkpoint may name this backend (False for backends that load code files: JIT packages)
    checkpointable: ClassVar[bool] = True
    #: whether a call whose object arguments (a KV cache) have a layout this backend was not built for is still
    #: answered right by it (dynamo's guards check that layout on every call; the eager backend runs the original):
    #: the dispatcher then skips walking such objects where the call's tensors single out the graph
    #: (`GraphDispatcher`)
    checks_object_layouts: ClassVar[bool] = False

    def __init__(self, config: BackendConfig | None = None) -> None:
        if config is not None and not isinstance(config, self.config_class):
            raise TypeError(
                f"{type(self).__name__} expects a {self.config_class.__name__}, got {type(config).__name__}"
            )
        self._config = config if config is not None else self.config_class()
        self._state = BackendState.INIT
        self._device: torch.device | None = None
        # what `refit()` rebuilds from (baked-weight backends only): module, graph spec, one sample, cache dir
        self._refit_inputs: tuple[torch.nn.Module, GraphSpec, list[Sample], Path] | None = None

    # ----------------------------------------------------------------- properties
    @property
    def config(self) -> BackendConfig:
        return self._config

    @property
    def state(self) -> BackendState:
        return self._state

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def device(self) -> torch.device | None:
        return self._device

    @property
    def is_active(self) -> bool:
        return self._state in (BackendState.ACTIVE, BackendState.DEPLOYED)

    @property
    def is_jit(self) -> bool:
        """True when the backend needs the original module alive (it compiles or wraps it)."""
        return True

    @property
    def bakes_weights(self) -> bool:
        """True when the backend holds its own copy of the module's weights (an exported graph, a quantized
        copy, an engine): a change of the module's weights makes it stale until `refit()`. Backends that read
        the weights at call time (eager, Inductor) say False."""
        return False

    @property
    def compiled_for_structure(self) -> bool:
        """True when what the backend runs was made for the module's structure at build time (its submodules'
        classes, its tensors' shapes, dtypes and devices): after such a change it would recompile inside a call,
        unvalidated (dynamo's guards fail), or fail, so the module watch stops it serving (`ModuleWatch`). Only a
        backend that runs the module itself (eager) says False."""
        return True

    @property
    def pins_output_dtypes(self) -> bool:
        """True when the backend casts its outputs to the dtypes recorded at build time (Inductor under its own
        autocast): after the module's dtypes change (`.double()`), those are no longer what the module returns, so
        its calls go to the original forward (`ModuleWatch`). False for backends whose outputs follow the module."""
        return False

    @property
    def exports_graph(self) -> bool:
        """True when the backend runs a program exported from one trace (ONNX, TensorRT): such a program can take
        input values as given where the recorded calls never varied them, so validation also probes a padded mask
        (`aitune_core.validation.value_probes`). False for backends that guard what they specialise (dynamo)."""
        return False

    @property
    def traces_whole_graph(self) -> bool:
        """True when a successful build proves that dynamo traced the module as one graph (a `fullgraph` compile):
        JIT tuning then skips its separate graph-break check, which would trace the module once more
        (`aitune_jit.tuner`). False for backends that may split the module or trace it another way."""
        return False

    # ----------------------------------------------------------------- identity
    def key(self) -> str:
        return f"{type(self).__name__}_{self._config.key()}"

    def describe(self) -> str:
        return f"{type(self).__name__}({self._config.describe()})"

    def __repr__(self) -> str:
        return f"{self.describe()}<{self._state.value}>"

    def blueprint_copy(self) -> Backend:
        """A fresh INIT copy carrying only the configuration (used per module and per graph)."""
        if self._state is not BackendState.INIT:
            raise BackendStateError(f"Only an INIT backend can serve as a blueprint; {self.name} is {self._state.name}")
        return copy.deepcopy(self)

    def tolerance(self, dtype: torch.dtype) -> Tolerance:
        """Validation tolerance for outputs of `dtype`; quantizing backends widen it."""
        from aitune_core.validation.tolerance import default_tolerance

        return default_tolerance(dtype, self._device)

    # ----------------------------------------------------------------- transitions
    def build(
        self,
        module: torch.nn.Module,
        graph_spec: GraphSpec,
        data: list[Sample],
        device: torch.device,
        cache_dir: Path,
    ) -> Backend:
        """Build for one module and graph; may run each sample of `data` at most once (stateful modules)."""
        if self._state is not BackendState.INIT:
            raise BackendStateError(f"{self.name}: build() is allowed once, from INIT; state is {self._state.name}")
        self._device = torch.device(device)
        try:
            with replaying(graph_spec):  # built (compiled, warmed up) as the program calls the graph
                self._build(module, graph_spec, data, Path(cache_dir))
        except BackendBuildError:
            raise
        except Exception as exc:  # any library error becomes a normal candidate failure
            raise BackendBuildError(f"{self.describe()} failed to build: {type(exc).__name__}: {exc}") from exc
        self._state = BackendState.ACTIVE
        if self.bakes_weights:
            self._refit_inputs = (module, graph_spec, list(data[:1]), Path(cache_dir))
        return self

    def refit(self) -> None:
        """Bring a baked copy of the weights up to date with the module it was built from (`bakes_weights`).

        Raises `BackendStateError` when the backend is not serving or cannot be refit (e.g. a checkpoint-loaded
        backend: it has no recorded sample to rebuild from), and the build error when refitting fails; the
        backend is then unchanged. The default rebuilds the backend from the same module, graph and one of its
        samples (`_refit`); subclasses may update weights in place instead.
        """
        if self._state is not BackendState.ACTIVE:
            raise BackendStateError(f"{self.name}: refit() needs ACTIVE; state is {self._state.name}")
        if self._refit_inputs is None:
            raise BackendStateError(f"{self.name}: nothing to refit from (not built in this process)")
        self._refit(*self._refit_inputs)

    def _refit(self, module: torch.nn.Module, graph_spec: GraphSpec, data: list[Sample], cache_dir: Path) -> None:
        """Rebuild into a fresh backend of the same configuration, then take over its state.

        Refits alternate between `cache_dir` and `cache_dir / "refit"`, so a failing rebuild never overwrites the
        artifacts of the engine in use (a checkpoint saved later copies them)."""
        inputs = self._refit_inputs
        slot = not self.__dict__.get("_refit_slot", False)
        fresh = type(self)(self._config)
        fresh.build(module, graph_spec, data, self._device or torch.device("cpu"),
                    cache_dir / "refit" if slot else cache_dir)
        self.__dict__.update(fresh.__dict__)
        self._refit_inputs = inputs
        self._refit_slot = slot

    def activate(self) -> None:
        if self._state in (BackendState.INIT, BackendState.DEPLOYED):
            raise BackendStateError(f"{self.name}: cannot activate from {self._state.name}")
        if self._state in (BackendState.INACTIVE, BackendState.CHECKPOINT_LOADED):
            self._activate()
            self._state = BackendState.ACTIVE

    def deactivate(self) -> None:
        if self._state in (BackendState.INIT, BackendState.DEPLOYED, BackendState.CHECKPOINT_LOADED):
            raise BackendStateError(f"{self.name}: cannot deactivate from {self._state.name}")
        if self._state is BackendState.ACTIVE:
            self._deactivate()
            self._free_memory()
            self._state = BackendState.INACTIVE

    def deploy(self, device: torch.device | str | None = None) -> None:
        if self._state is not BackendState.CHECKPOINT_LOADED:
            raise BackendStateError(f"{self.name}: deploy() needs CHECKPOINT_LOADED; state is {self._state.name}")
        if device is not None:
            self._device = torch.device(device)
        self._deploy()
        self._state = BackendState.DEPLOYED

    def infer(self, *args: Any, **kwargs: Any) -> Any:
        if self._state not in (BackendState.ACTIVE, BackendState.DEPLOYED):
            raise BackendStateError(f"{self.name}: cannot infer in state {self._state.name}")
        return self._infer(*args, **kwargs)

    __call__ = infer

    def serve(self, *args: Any, **kwargs: Any) -> Any:
        """A call from the dispatcher, on the program's thread: `infer`, except that a backend may refuse to compile
        there and answer with the plain code, raising `CompiledCodeMissed` with that answer (TorchInductorBackend).
        Builds, validation and measurement call `infer`, which may compile."""
        return self.infer(*args, **kwargs)

    def _mark_checkpoint_loaded(self) -> None:
        """Used by `from_dict` implementations."""
        self._state = BackendState.CHECKPOINT_LOADED

    @staticmethod
    def _free_memory() -> None:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # ----------------------------------------------------------------- serialization
    def to_dict(self) -> dict[str, Any]:
        """Serializable state. `pathlib.Path` values are artifacts the checkpoint copies and checksums."""
        if self._state is BackendState.INIT:
            raise BackendStateError(f"{self.name}: nothing to serialize before build(); state is {self._state.name}")
        return {
            self.STATE_TYPE: type(self).__name__,
            self.STATE_CONFIG: self._config.to_dict(),
            "device": str(self._device) if self._device is not None else None,
            **self._extra_state(),
        }

    def _extra_state(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_dict(cls, module: torch.nn.Module | None, state_dict: dict[str, Any]) -> Backend:
        """Recreate a backend from `to_dict()` output, in state CHECKPOINT_LOADED."""
        if state_dict.get(cls.STATE_TYPE) != cls.__name__:
            raise ValueError(f"{cls.__name__}.from_dict got a state of type {state_dict.get(cls.STATE_TYPE)!r}")
        backend = cls(cls.config_class.from_dict(dict(state_dict[cls.STATE_CONFIG])))
        device = state_dict.get("device")
        backend._device = torch.device(device) if device else None
        backend._load_extra_state(module, state_dict)
        backend._mark_checkpoint_loaded()
        return backend

    def _load_extra_state(self, module: torch.nn.Module | None, state_dict: dict[str, Any]) -> None:  # noqa: B027
        """Restore what `_extra_state` saved (subclasses)."""

    # ----------------------------------------------------------------- subclass hooks
    @abstractmethod
    def _build(self, module: torch.nn.Module, graph_spec: GraphSpec, data: list[Sample], cache_dir: Path) -> None:
        """Produce a runnable backend; raise on failure."""

    def _activate(self) -> None:  # noqa: B027
        """Re-create runtime resources after deactivate() or checkpoint load."""

    def _deactivate(self) -> None:  # noqa: B027
        """Release runtime resources (GPU memory, compiled caches)."""

    def _deploy(self) -> None:
        """Finalize a checkpoint-loaded backend for inference."""
        self._activate()

    @abstractmethod
    def _infer(self, *args: Any, **kwargs: Any) -> Any:
        """Run the backend."""
