"""`aitune.torch.Module`: a transparent proxy around a torch module that records, tunes and dispatches.

The proxy (a wrapt `CallableObjectProxy`) forwards attribute access, indexing, `isinstance` and `state_dict` to
the wrapped module. What changes is the wrapped module's `forward`: a `ForwardSlot` (aitune_core/forward_slot.py)
routes each call by the wrapper's state:

- INIT / PASSTHROUGH: the original forward, unchanged;
- RECORDING: the original forward, and the call is recorded as the forward received it (GraphRecorder, batch size
  from the global context); a forward that changes its arguments is not recorded and `tune` refuses it;
- TUNED: a GraphDispatcher over the tuned backends, with an eager fallback (and one warning) for calls
  outside the tuned shape ranges. Its `ModuleWatch` follows the wrapped module after tuning (weights, submodules,
  training flags, hooks on submodules): baked-weight backends are refit, and calls no backend may serve run
  the original forward (`aitune_core/backends/module_watch.py`).

Because the routing sits in `forward`, calling the proxy goes through the wrapped module's own `__call__`: forward
pre/post hooks registered on it fire in every state, exactly once, and a parent that still holds the raw module
(not the proxy) is routed too. Backends represent `forward` only:
- while a backend runs (and while strategies build backends, or a checkpoint restores them), the module's forward
  hooks are hidden (its hook dicts swapped: a call from another thread at that moment would not fire them), so a
  backend that calls the module neither fires them twice nor bakes them into a compiled graph;
- a re-entrant call of the module's forward (a backend that calls the module) runs the original forward,
  never the dispatcher again, and so does a call traced by torch.compile (the routing is not traced);
- a forward the program replaces later (class patch, `__class__` swap) answers every call, with one warning.

`state_dict()` stays the wrapped module's own (a parent's `state_dict()` is unchanged by wrapping); the tuned state
is `to_dict()` / `from_dict()`, and whole checkpoints are written by `aitune.torch.save` / `load`.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import wrapt

from aitune_aot.chainable import install_chainable_methods
from aitune_aot.hooks_hidden import hooks_hidden
from aitune_aot.registry import MODULE_REGISTRY, default_name, sanitize_name
from aitune_aot.strategy_choice import default_strategy, strategies_for, validate_strategies
from aitune_core import torchscript_slots
from aitune_core.backends.backend import Backend, BackendState
from aitune_core.config import config
from aitune_core.errors import NotReplayableError
from aitune_core.forward_slot import ForwardSlot
from aitune_core.log import SEPARATOR, THIN_SEPARATOR, timed
from aitune_core.module_info import module_device
from aitune_core.recording.argument_watch import ArgumentWatch
from aitune_core.strategies.tune_job import TuneJob

if TYPE_CHECKING:
    from aitune_core.backends.dispatcher import GraphDispatcher
    from aitune_core.recording.graph_recorder import GraphRecorder
    from aitune_core.specs.graph_spec import GraphSpec
    from aitune_core.strategies.strategy import TuneStrategy

__all__ = ["Module", "ModuleState", "StrategyList", "StrategyMap", "default_strategy", "find_wrapper"]

_logger = logging.getLogger("aitune.aot.module")

StrategyList = Sequence["TuneStrategy"]
StrategyMap = Mapping[str, "TuneStrategy"]

class ModuleState(enum.Enum):
    INIT = "init"
    PASSTHROUGH = "passthrough"
    RECORDING = "recording"
    TUNED = "tuned"


def find_wrapper(module: Any) -> Module | None:
    """The aitune Module wrapping `module` (a proxy or the raw module whose forward it routes), else None."""
    if isinstance(module, Module):
        return module
    slot = ForwardSlot.of(module)
    owner = slot.owner if slot is not None else None
    return owner if isinstance(owner, Module) else None


class Module(wrapt.CallableObjectProxy):
    """AITune module wrapper: behaves like the wrapped torch module and adds recording, tuning and dispatch.

    States: passthrough (identical to the original), recording (records samples and detects graphs; needed
    before tuning) and tuned (runs the tuned backends). `enable_passthrough()` / `enable_recording()` switch
    between the first two; leaving the tuned state needs `force=True`, which drops the tuned backends.

    Args:
        module: the torch module to wrap.
        name: unique name (sanitized; a suffix is added if the name is taken); defaults to the class name.
        strategy: strategy for every graph of this module (takes precedence over the one given to `tune`).
        strategies: one strategy per graph, as a list (in graph order) or a dict keyed by graph name.
    """

    TYPE: ClassVar[str] = "aitune.torch.Module"
    TYPE_KEY: ClassVar[str] = "type"
    NAME_KEY: ClassVar[str] = "name"
    GRAPH_SPECS_KEY: ClassVar[str] = "graph_specs"
    BACKENDS_KEY: ClassVar[str] = "backends"

    def __init__(
        self,
        module: torch.nn.Module,
        name: str | None = None,
        strategy: TuneStrategy | None = None,
        strategies: StrategyList | StrategyMap | None = None,
    ) -> None:
        if isinstance(module, Module):
            raise TypeError(f"module is already an aitune Module ({module.name!r}); wrap the original module once")
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"aitune Module wraps a torch.nn.Module, got {type(module).__name__}")
        existing = find_wrapper(module)
        if existing is not None:
            raise ValueError(f"this {type(module).__name__} is already wrapped by aitune Module {existing.name!r}")
        if "forward" in module.__dict__:
            by = ("aitune's JIT tuning, which saw it called before it was wrapped: wrap it before its first call, or "
                  "call aitune.torch.jit.disable() first" if ForwardSlot.of(module) else "another tool")
            raise ValueError(f"this {type(module).__name__} has an instance-level forward (set by {by}); aitune "
                             "cannot route its calls")
        validate_strategies(strategy, strategies)
        super().__init__(module)
        self._self_strategy = strategy
        self._self_strategies = strategies
        self._self_state = ModuleState.INIT
        self._self_recorder: GraphRecorder | None = None
        self._self_prev_recorder: GraphRecorder | None = None
        self._self_not_replayable: str | None = None  # what the forward changed in its arguments, when it did
        self._self_graphs: list[tuple[GraphSpec, Backend]] = []
        self._self_dispatcher: GraphDispatcher | None = None
        self._self_backend_failed = False
        self._self_active = False
        self._self_local = threading.local()
        self._self_orig_forward = module.forward
        explicit = sanitize_name(name)
        self._self_name = MODULE_REGISTRY.register(explicit or default_name(module), self, explicit=bool(explicit))
        self._self_slot = ForwardSlot(module, self._route_call, owner=self, label=self._self_name,
                                      on_change=self._forward_changed).install()
        torchscript_slots.install()  # torch.jit.script of the module sees its own forward (kept for the process)

    def _forward_changed(self, what: str) -> None:
        """The program replaced the forward (`ForwardSlot`): its slot answers with the new one from now on."""
        _logger.warning("Module %r: %s after it was wrapped; its calls run the new forward eagerly from now on (wrap "
                        "it again to tune it)", self._self_name, what)

    def _route_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return self._route(*args, **kwargs)

    @contextmanager
    def _original_forward(self) -> Iterator[torch.nn.Module]:
        """The wrapped module with its own forward and no forward hooks, for strategies and backends."""
        with self._self_slot.suspended(), hooks_hidden(self.__wrapped__):
            yield self.__wrapped__

    # ------------------------------------------------------------------ call routing
    def _route(self, *args: Any, **kwargs: Any) -> Any:
        state = self._self_state
        local = self._self_local
        if getattr(local, "busy", False) or state in (ModuleState.INIT, ModuleState.PASSTHROUGH):
            return self._self_orig_forward(*args, **kwargs)
        local.busy = True
        try:
            if state is ModuleState.RECORDING:
                return self._recorded_call(args, kwargs)
            if not self._self_active:  # deactivated while other modules tune: run eagerly
                return self._self_orig_forward(*args, **kwargs)
            with hooks_hidden(self.__wrapped__):  # the caller's __call__ fires them, once
                return self._self_dispatcher(*args, **kwargs)
        finally:
            local.busy = False

    def _recorded_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run the original forward and record the call as the forward received it; a forward that changes its
        arguments (a KV cache it appends to) is remembered as not replayable, and `tune` refuses it."""
        recorder = self._self_recorder
        watch = ArgumentWatch.before(args, kwargs, recorder.binder.positional)
        output = self._self_orig_forward(*args, **kwargs)
        changed = watch.changes()
        if changed is not None:
            if self._self_not_replayable is None:
                self._self_not_replayable = changed
                _logger.warning("Module %r: its forward changes %s; its calls cannot be replayed for tuning",
                                self._self_name, changed)
            return output
        recorder.record(watch.args, watch.kwargs, output)  # batch size: from the global context
        return output

    def _backend_failed(self, backend: Backend, exc: Exception) -> None:
        """A tuned backend raised at run time and the original forward answered the call: warn once."""
        if not self._self_backend_failed:
            self._self_backend_failed = True
            _logger.warning("Module `%s`: backend %s failed at run time (%s: %s); answering with the original module. "
                            "This warning is shown once.", self._self_name, backend.describe(), type(exc).__name__, exc)

    def _refit_backend(self, backend: Backend) -> bool:
        """Refit a baked-weight backend from the module's own forward, without the routing (a copy of the module
        made by the rebuild must not route back to this wrapper)."""
        from aitune_core.backends.refit import refit_backend

        with self._original_forward():
            return refit_backend(backend)

    def _refresh_backends(self) -> None:
        """Bring baked-weight backends up to date with the module's current weights before they are saved;
        raises `CheckpointError` when one cannot be refit (a checkpoint must never hold stale backends)."""
        from aitune_core.errors import CheckpointError

        verdict = self._self_dispatcher.settle() if self._self_dispatcher is not None else None
        stale = [b.describe() for _s, b in self._self_graphs if verdict is not None and id(b) in verdict.blocked]
        if stale:
            raise CheckpointError(f"Module {self._self_name!r}: {', '.join(stale)} could not be refit to the module's "
                                  "current weights; re-tune it before saving")

    # ------------------------------------------------------------------ properties
    @property
    def name(self) -> str:
        """Unique name of the wrapper (used for the cache folder and in checkpoints)."""
        return self._self_name

    @property
    def state(self) -> ModuleState:
        return self._self_state

    @property
    def device(self) -> torch.device:
        """Device of the wrapped module's first parameter or buffer (CPU for a module without tensors)."""
        return module_device(self.__wrapped__) or torch.device("cpu")

    @property
    def graph_specs(self) -> list[GraphSpec]:
        """Graphs of the module: the tuned ones, else the ones recorded so far."""
        if self._self_state is ModuleState.TUNED:
            return [spec for spec, _ in self._self_graphs]
        recorder = self._self_recorder or self._self_prev_recorder
        return list(recorder.graph_specs) if recorder is not None else []

    @property
    def backends(self) -> list[tuple[GraphSpec, Backend]]:
        """(graph spec, tuned backend) pairs; empty unless the module is tuned."""
        return list(self._self_graphs)

    @property
    def is_active(self) -> bool:
        return self._self_state is ModuleState.TUNED and self._self_active

    def __repr__(self) -> str:
        return f"Module[{self._self_name!r}, {self._self_state.value}]({self.__wrapped__!r})"

    def __getitem__(self, key: Any) -> Any:
        """Indexing goes to the wrapped module (e.g. `Sequential`)."""
        return self.__wrapped__[key]

    def __deepcopy__(self, memo: dict) -> Any:
        raise TypeError(
            f"aitune Module {self._self_name!r} cannot be deep-copied; copy the original module and wrap the copy"
        )

    def __reduce_ex__(self, protocol: int) -> Any:
        raise TypeError(
            f"aitune Module {self._self_name!r} cannot be pickled; use aitune.torch.save(model, path) for tuned "
            "modules, or save the wrapped module's state_dict()"
        )

    # ------------------------------------------------------------------ state transitions
    def _reset(self) -> None:
        """Drop tuned backends and recordings: back to the freshly wrapped module."""
        self._drop_backends()
        self._self_recorder = None
        self._self_prev_recorder = None
        self._self_state = ModuleState.INIT
        _logger.info("Module `%s` reset: tuned backends and recordings dropped", self._self_name)

    def _drop_backends(self) -> None:
        for _spec, backend in self._self_graphs:
            if backend.state is BackendState.ACTIVE:
                backend.deactivate()
        self._self_graphs = []
        self._self_dispatcher = None
        self._self_active = False

    def _refuse_if_tuned(self, force: bool, target: str) -> None:
        if self._self_state is ModuleState.TUNED:
            if not force:
                raise RuntimeError(
                    f"Module {self._self_name!r} is already tuned. Use enable_{target}(force=True) to reset it "
                    "(its tuned backends are dropped)."
                )
            self._reset()

    def enable_passthrough(self, force: bool = False) -> None:
        """Run the original module. From the tuned state only with `force=True` (resets the module)."""
        self._refuse_if_tuned(force, "passthrough")
        if self._self_state is ModuleState.RECORDING:
            self._self_prev_recorder = self._self_recorder  # a later enable_recording() continues it
            self._self_recorder = None
        self._self_state = ModuleState.PASSTHROUGH

    def enable_recording(self, force: bool = False) -> None:
        """Record calls (needed before tuning). From the tuned state only with `force=True` (resets the module)."""
        self._refuse_if_tuned(force, "recording")
        if self._self_state is ModuleState.RECORDING:
            return
        if self._self_prev_recorder is not None:
            self._self_recorder, self._self_prev_recorder = self._self_prev_recorder, None
        else:
            from aitune_core.recording.graph_recorder import GraphRecorder

            self._self_recorder = GraphRecorder(self._self_orig_forward, name=self._self_name)
            self._self_not_replayable = None
        self._self_state = ModuleState.RECORDING

    def activate(self) -> None:
        """Route calls to the tuned backends again (after `deactivate()`)."""
        if self._self_state is ModuleState.TUNED:
            with self._original_forward():
                for _spec, backend in self._self_graphs:
                    if not backend.is_active:
                        backend.activate()
            self._self_active = True
        elif self._self_state is ModuleState.PASSTHROUGH:
            return
        else:
            raise RuntimeError(f"Module {self._self_name!r} is not tuned ({self._self_state.value}); cannot activate")

    def deactivate(self) -> None:
        """Release the tuned backends' resources; calls run the original module until `activate()`."""
        if self._self_state is not ModuleState.TUNED:
            return
        for _spec, backend in self._self_graphs:
            if backend.state is BackendState.ACTIVE:  # deployed (checkpoint-loaded) backends stay as they are
                backend.deactivate()
        self._self_active = False

    # ------------------------------------------------------------------ tuning
    def _strategies_for(self, graph_specs: Sequence[GraphSpec], strategy: TuneStrategy | None) -> list[TuneStrategy]:
        return strategies_for(self._self_name, graph_specs, self._self_strategies, self._self_strategy or strategy,
                              default_strategy)

    def _cache_dir(self, graph_spec: GraphSpec) -> Path:
        path = Path(config.cache_dir) / self._self_name / graph_spec.name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def tune(
        self,
        device: torch.device | str | None = None,
        strategy: TuneStrategy | None = None,
        dry_run: bool = False,
    ) -> None:
        """Tune every recorded graph; strategies given to the module take precedence over `strategy`.

        Args:
            device: the device to tune on (default: the module's device).
            strategy: the strategy for graphs the module has no strategy for.
            dry_run: only log what would be tuned; the module keeps its recording.
        """
        if self._self_state is ModuleState.TUNED:
            raise ValueError(
                f"Module {self._self_name!r} has already been tuned; enable_recording(force=True) resets it"
            )
        if self._self_not_replayable is not None:
            raise NotReplayableError(
                f"Module {self._self_name!r} cannot be tuned: its forward changes {self._self_not_replayable}, so "
                "its calls cannot be replayed (wrap a submodule that leaves its arguments alone instead)"
            )
        if self._self_state is not ModuleState.RECORDING or not self.graph_specs:
            raise ValueError(
                f"Module {self._self_name!r} has not recorded any samples; call enable_recording() and run it "
                "(or use aitune.torch.tune(...)) before tuning"
            )
        if strategy is not None:
            validate_strategies(strategy, None)
        device = torch.device(device) if device is not None else self.device
        recorder = self._self_recorder
        graph_specs = list(recorder.graph_specs)
        strategies = self._strategies_for(graph_specs, strategy)

        _logger.info(SEPARATOR)
        _logger.info("🎯 Tuning module: `%s` (all graphs)%s", self._self_name, " [dry run]" if dry_run else "")
        tuned: list[tuple[GraphSpec, Backend]] = []
        try:
            with timed(_logger, f"Tuning module `{self._self_name}`"), self._original_forward() as module:
                for graph_strategy, graph_spec in zip(strategies, graph_specs):
                    _logger.info(THIN_SEPARATOR)
                    data = recorder.samples(graph_spec)
                    cache_dir = self._cache_dir(graph_spec)
                    job = TuneJob.of(module, self._self_name, graph_spec, data, device, cache_dir)
                    if dry_run:
                        graph_strategy.dry_run(job)
                    else:
                        tuned.append((graph_spec, graph_strategy.run(job).backend))
        except BaseException:
            for _spec, backend in tuned:
                if backend.state is BackendState.ACTIVE:
                    backend.deactivate()
            raise
        if dry_run:
            _logger.info("✅ Dry run of module `%s` finished; the module keeps its recording.", self._self_name)
            _logger.info(SEPARATOR)
            return
        self._install_backends(tuned)
        self._self_prev_recorder = None
        self._self_recorder = None
        _logger.info("✅ Tuning module: `%s` (all graphs) completed.", self._self_name)
        _logger.info(SEPARATOR)

    def _install_backends(self, graphs: list[tuple[GraphSpec, Backend]]) -> None:
        from aitune_core.backends.dispatcher import GraphDispatcher
        from aitune_core.backends.module_watch import ModuleWatch

        self._self_graphs = list(graphs)
        watch = ModuleWatch(self.__wrapped__, [backend for _spec, backend in graphs], self._self_name)
        self._self_dispatcher = GraphDispatcher(
            self._self_graphs, self._self_orig_forward, self._self_name, on_backend_error=self._backend_failed,
            watch=watch, refit=self._refit_backend,
        )
        self._self_state = ModuleState.TUNED
        self._self_active = True

    def _load_backends(
        self, load: Callable[[torch.nn.Module], list[tuple[GraphSpec, Backend]]], device: torch.device | None
    ) -> None:
        """Replace the module's state with checkpoint-loaded backends, deployed on `device`.

        `load(module)` receives the wrapped module with its original forward and returns the backends in
        state CHECKPOINT_LOADED.
        """
        if device is not None:
            self.__wrapped__.to(device)
        device = device if device is not None else self.device
        self._drop_backends()
        with self._original_forward() as module:
            graphs = load(module)
            for _spec, backend in graphs:
                backend.deploy(device)
        self._self_recorder = None
        self._self_prev_recorder = None
        self._install_backends(graphs)

    # ------------------------------------------------------------------ serialization
    def to_dict(
        self, *args: Any, destination: dict | None = None, prefix: str = "", keep_vars: bool = False
    ) -> dict[str, Any]:
        """The tuned state, stored at `destination[prefix]` (torch `state_dict` calling convention).

        The value holds the name, the graph specs (`GraphSpec.to_dict()`) and each graph's `Backend.to_dict()`.
        """
        if self._self_state is not ModuleState.TUNED:
            raise RuntimeError(f"Module {self._self_name!r} is not tuned; nothing to serialize")
        destination = OrderedDict() if destination is None else destination
        destination[prefix] = {
            self.TYPE_KEY: self.TYPE,
            self.NAME_KEY: self._self_name,
            self.GRAPH_SPECS_KEY: [spec.to_dict() for spec, _ in self._self_graphs],
            self.BACKENDS_KEY: [
                {"graph": spec.name, "backend": backend.to_dict()} for spec, backend in self._self_graphs
            ],
        }
        return destination

    @staticmethod
    def is_state_dict_valid(state_dict: Any) -> bool:
        """True when `state_dict` is the value `to_dict()` stored for a tuned Module."""
        return (
            isinstance(state_dict, Mapping)
            and state_dict.get(Module.TYPE_KEY) == Module.TYPE
            and isinstance(state_dict.get(Module.NAME_KEY), str)
            and isinstance(state_dict.get(Module.GRAPH_SPECS_KEY), list)
            and isinstance(state_dict.get(Module.BACKENDS_KEY), list)
        )

    @staticmethod
    def from_dict(
        module: torch.nn.Module, state_dict: Mapping[str, Any], device: torch.device | str | None = None
    ) -> Module:
        """Wrap `module` and restore the tuned state saved by `to_dict()` (backends deployed on `device`)."""
        if not Module.is_state_dict_valid(state_dict):
            raise ValueError("Invalid dictionary format for aitune Module (expected the value written by to_dict())")
        from aitune_core.backends.registry import backend_class
        from aitune_core.specs.graph_spec import GraphSpec

        specs = {d["name"]: GraphSpec.from_dict(d) for d in state_dict[Module.GRAPH_SPECS_KEY]}

        def load(raw: torch.nn.Module) -> list[tuple[GraphSpec, Backend]]:
            return [
                (specs[item["graph"]], backend_class(item["backend"]["type"]).from_dict(raw, item["backend"]))
                for item in state_dict[Module.BACKENDS_KEY]
            ]

        wrapper = Module(module, state_dict[Module.NAME_KEY])
        wrapper._load_backends(load, torch.device(device) if device is not None else None)
        return wrapper


install_chainable_methods(Module)
