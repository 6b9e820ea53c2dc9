"""`GraphRecorder`: turns a module's calls into graphs (GraphSpec) and a bounded set of samples per graph.

Per call: bind `(args, kwargs)` to forward's signature, flatten the bound arguments, compute the
graph identity (layout, tensor ranks and dtypes, the non-tensor values in strict mode, and the thread's
`torch.autocast` state and default device: `autocast_state`, `default_device`; a call that differs from a graph only
in int / float values joins it, those arguments becoming its free scalars: `free_scalars`), then
update that graph's running shape statistics (min/max per axis, batch-size following) from every
call, and offer the call to the graph's bounded sample store.

Graph names are "0", "1", ... in order of first observation. The returned `GraphSpec` objects are
immutable snapshots; a new one replaces the old in `graph_specs` when a range or an axis name changes.

Thread-safe: the state of every graph is updated under one lock; binding and flattening (pure) run
outside it. `match` and `graph_specs` read a snapshot and take no lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from aitune_core.config import config
from aitune_core.context import current_batch_size
from aitune_core.log import get_logger
from aitune_core.recording.sample import Sample
from aitune_core.recording.sample_store import SampleStore
from aitune_core.specs.autocast_state import AutocastState, current_autocast
from aitune_core.specs.axis_inference import BatchEvidence, ShapeTracker, implied_batch_size
from aitune_core.specs.binding import Binder
from aitune_core.specs.default_device import current_default_device
from aitune_core.specs.free_scalars import freed, loose_identity, marker_for
from aitune_core.specs.graph_spec import GraphSpec
from aitune_core.specs.sample_metadata import SampleMetadata, call_identity
from aitune_core.specs.tree import flatten_values

_logger = get_logger("recording")


@dataclass
class _GraphState:
    name: str
    binder: Binder
    input_meta: SampleMetadata
    output_meta: SampleMetadata
    output_identity: tuple[Any, ...]
    input_trackers: list[ShapeTracker]
    output_trackers: list[ShapeTracker]
    evidence: BatchEvidence
    store: SampleStore
    spec: GraphSpec
    autocast: AutocastState
    default_device: str | None
    mode: str | None = None
    num_calls: int = 0
    inference_mode: bool = False  # a call of it was made under `torch.inference_mode()` (`GraphSpec.inference_mode`)
    warned_output: bool = False


def _shapes(values: Sequence[Any]) -> list[tuple[int, ...]]:
    return [tuple(v.shape) for v in values if isinstance(v, torch.Tensor)]


class GraphRecorder:
    """Records calls of one forward into graphs.

    Args:
        forward: the module (its `forward` is used) or the callable whose signature binds the calls.
        strict: graph identity includes non-tensor values; default `config.strict_mode` (read now).
        free_scalars: in strict mode, calls that differ only in int / float values join one graph
            (`free_scalars`); default `config.free_scalars` (read now).
        max_samples: samples kept per graph; default `config.max_num_samples_stored` (read now).
        max_graphs: graphs recorded at most; calls of further graphs are not recorded (`record` returns None,
            with one warning); default `config.max_num_graphs` (read now).
        name: used in log messages only.
    """

    def __init__(
        self,
        forward: Callable[..., Any],
        *,
        strict: bool | None = None,
        free_scalars: bool | None = None,
        max_samples: int | None = None,
        max_graphs: int | None = None,
        name: str | None = None,
    ) -> None:
        self.binder = Binder.from_callable(forward)
        self.strict = config.strict_mode if strict is None else bool(strict)
        self.joins_scalars = self.strict and (config.free_scalars if free_scalars is None else bool(free_scalars))
        self.max_samples = config.max_num_samples_stored if max_samples is None else int(max_samples)
        if self.max_samples < 1:
            raise ValueError(f"max_samples must be >= 1, got {self.max_samples}")
        self.max_graphs = config.max_num_graphs if max_graphs is None else int(max_graphs)
        if self.max_graphs < 1:
            raise ValueError(f"max_graphs must be >= 1, got {self.max_graphs}")
        self.graphs_refused = 0  # calls not recorded because they would have made a graph beyond max_graphs
        self.name = name
        self._lock = threading.Lock()
        self._graphs: dict[tuple[Any, ...], _GraphState] = {}
        # graphs with int / float constants, by their identity with those values left out (`free_scalars`)
        self._loose: dict[tuple[Any, ...], _GraphState] = {}
        self._by_name: dict[str, _GraphState] = {}
        self._specs: list[GraphSpec] = []  # replaced, never mutated: a snapshot for lock-free readers
        self._total_calls = 0

    # -- recording --------------------------------------------------------------------------------
    def _bind(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[Binder, dict[str, Any]]:
        try:
            return self.binder, self.binder.bind(args, kwargs)
        except TypeError:
            # The call ran, so Python accepted it; our reading of the signature did not (e.g. a
            # decorator that hides the real one). Record it under the generic (*args, **kwargs) binder.
            generic = Binder.generic()
            return generic, generic.bind(args, kwargs)

    def record(
        self,
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        output: Any,
        batch_size: int | None = None,
        *,
        after: tuple[tuple[Any, ...], dict[str, Any]] | None = None,
        keep: bool = False,
    ) -> GraphSpec | None:
        """Record one call and its output; returns the (updated) spec of the call's graph, or None when the
        call would make a new graph beyond `max_graphs` (then nothing is recorded).

        `after`: for a call that changed its arguments, `(args, kwargs)` as the forward left them, with `args` /
        `kwargs` copies taken before it ran (a stateful sample, see `Sample.capture`).

        `batch_size` None means "take it from the global context" (`current_batch_size()`), which is
        None too in JIT mode. `keep`: the sample is stored whatever its shapes (`SampleStore.offer`).
        """
        if batch_size is None:
            batch_size = current_batch_size()
        args = tuple(args)
        kwargs = dict(kwargs)
        binder, bound = self._bind(args, kwargs)
        in_values, in_treedef = flatten_values(bound)
        out_values, out_treedef = flatten_values(output)
        autocast, device = current_autocast(), current_default_device()
        identity = (binder, *call_identity(in_values, in_treedef, self.strict), autocast, device)
        out_identity = call_identity(out_values, out_treedef, strict=False)
        in_shapes = _shapes(in_values)
        out_shapes = _shapes(out_values)
        implied = implied_batch_size(in_shapes)

        with self._lock:
            self._total_calls += 1
            state = self._graphs.get(identity)
            if state is None:
                loose = ((binder, *loose_identity(in_values, in_treedef), autocast, device) if self.joins_scalars
                         else None)
                state = self._joined(loose, in_values)
            if state is None:
                if len(self._graphs) >= self.max_graphs:
                    self._refuse_graph()
                    return None
                state = self._new_graph(identity, binder, in_values, in_treedef, out_values, out_treedef, out_identity,
                                        (autocast, device))
                if loose is not None and any(marker_for(value) is not None for _, value in state.input_meta.constants):
                    self._loose.setdefault(loose, state)
            state.num_calls += 1
            if not state.inference_mode and torch.is_inference_mode_enabled():
                state.inference_mode = True
                self._refresh_spec(state)
            state.evidence.observe(batch_size, implied)
            changed = False
            for tracker, shape in zip(state.input_trackers, in_shapes):
                changed |= tracker.observe(shape, batch_size, implied)
            if out_identity == state.output_identity:
                for tracker, shape in zip(state.output_trackers, out_shapes):
                    changed |= tracker.observe(shape, batch_size, implied)
            elif not state.warned_output:
                state.warned_output = True
                _logger.warning(
                    "%sgraph %s: the output structure changed between calls of one input structure (outputs "
                    "that depend on the values of its inputs, a Python number's included); output ranges keep "
                    "the first structure, and backends will fail validation on such calls",
                    f"{self.name}: " if self.name else "",
                    state.name,
                )
            mode = state.evidence.mode
            if changed or mode != state.mode:
                state.mode = mode
                self._refresh_spec(state)
            state.store.offer(
                in_shapes, batch_size, lambda: Sample.capture(args, kwargs, output, batch_size, after=after), keep=keep
            )
            return state.spec

    def _joined(self, loose: tuple[Any, ...] | None, in_values: list[Any]) -> _GraphState | None:
        """The graph a call joins that differs from it only in int / float values (None: no such graph); the
        arguments whose value differs become free scalars of that graph (`free_scalars`)."""
        state = self._loose.get(loose) if loose is not None else None
        if state is None:
            return None
        meta = freed(state.input_meta, in_values)
        if meta is not None:
            state.input_meta = meta
            self._refresh_spec(state)
            _logger.debug("%sgraph %s: free scalars %s (their values change between calls)",
                          f"{self.name}: " if self.name else "", state.name, state.spec.free_scalars())
        return state

    def _refuse_graph(self) -> None:
        self.graphs_refused += 1
        if self.graphs_refused == 1:
            _logger.warning(
                "%salready %d graphs recorded (config.max_num_graphs); calls that would make new graphs are not "
                "recorded and run as they are. Graphs multiply when non-tensor arguments change between calls "
                "in strict mode: consider config.strict_mode = False",
                f"{self.name}: " if self.name else "",
                self.max_graphs,
            )

    def _new_graph(
        self,
        identity: tuple[Any, ...],
        binder: Binder,
        in_values: list[Any],
        in_treedef: Any,
        out_values: list[Any],
        out_treedef: Any,
        out_identity: tuple[Any, ...],
        thread_state: tuple[AutocastState, str | None],
    ) -> _GraphState:
        name = str(len(self._graphs))
        input_meta = SampleMetadata.from_leaves(in_values, in_treedef)
        output_meta = SampleMetadata.from_leaves(out_values, out_treedef, names_prefix="outputs")
        autocast, device = thread_state
        spec = GraphSpec(name, input_meta, output_meta, binder, self.strict, autocast, device)
        state = _GraphState(
            name=name,
            binder=binder,
            input_meta=input_meta,
            output_meta=output_meta,
            output_identity=out_identity,
            input_trackers=[ShapeTracker(t.min_shape) for t in input_meta.tensors],
            output_trackers=[ShapeTracker(t.min_shape) for t in output_meta.tensors],
            evidence=BatchEvidence(),
            store=SampleStore(self.max_samples),
            spec=spec,
            autocast=autocast,
            default_device=device,
        )
        self._graphs[identity] = state
        self._by_name[name] = state
        self._specs = [*self._specs, spec]
        _logger.debug("%snew graph %s", f"{self.name}: " if self.name else "", name)
        return state

    @staticmethod
    def _updated(meta: SampleMetadata, trackers: list[ShapeTracker], mode: str | None) -> SampleMetadata:
        return meta.with_tensors(
            [
                replace(spec, shape=tr.axes(mode), min_shape=tuple(tr.min_shape), max_shape=tuple(tr.max_shape))
                for spec, tr in zip(meta.tensors, trackers)
            ]
        )

    def _refresh_spec(self, state: _GraphState) -> None:
        spec = GraphSpec(
            state.name,
            self._updated(state.input_meta, state.input_trackers, state.mode),
            self._updated(state.output_meta, state.output_trackers, state.mode),
            state.binder,
            self.strict,
            state.autocast,
            state.default_device,
            inference_mode=state.inference_mode,
        )
        state.spec = spec
        self._specs = [spec if s.name == state.name else s for s in self._specs]

    # -- queries ----------------------------------------------------------------------------------
    @property
    def graph_specs(self) -> list[GraphSpec]:
        """Current spec of every graph, in order of first observation."""
        return list(self._specs)

    @property
    def total_calls(self) -> int:
        return self._total_calls

    def _state(self, graph_spec: GraphSpec | str) -> _GraphState:
        name = graph_spec if isinstance(graph_spec, str) else graph_spec.name
        state = self._by_name.get(name)
        if state is None:
            raise KeyError(f"no graph named {name!r} was recorded")
        return state

    def graph_spec(self, name: str) -> GraphSpec:
        return self._state(name).spec

    def samples(self, graph_spec: GraphSpec | str) -> list[Sample]:
        """The stored samples of a graph (at most `max_samples`), in recording order."""
        with self._lock:
            return self._state(graph_spec).store.samples()

    def num_samples(self, graph_spec: GraphSpec | str) -> int:
        """How many calls were recorded for a graph (every call, not only the stored ones)."""
        return self._state(graph_spec).num_calls

    def recorded_at_least(self, args: Sequence[Any], kwargs: Mapping[str, Any], count: int) -> bool:
        """Whether the graph this call belongs to has `count` recorded calls already (computing the call's
        identity only: nothing is copied). A caller that needs only graphs it has not seen enough of skips the
        others' calls with it."""
        try:
            binder, bound = self._bind(tuple(args), dict(kwargs))
            values, treedef = flatten_values(bound)
            thread_state = (current_autocast(), current_default_device())
            state = self._graphs.get((binder, *call_identity(values, treedef, self.strict), *thread_state))
            if state is None and self.joins_scalars:
                state = self._loose.get((binder, *loose_identity(values, treedef), *thread_state))
        except Exception:
            return False
        return state is not None and state.num_calls >= count

    def match(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> GraphSpec | None:
        """The first graph that `accepts` the call (identity matches and shapes are in range), or None."""
        for spec in self._specs:
            if spec.accepts(args, kwargs):
                return spec
        return None
