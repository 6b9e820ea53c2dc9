"""`HighestThroughputStrategy`: build, validate and profile every backend; the highest throughput wins.

Two ways to profile:

- **At an estimated batch size** (AOT, the default when the graph has a batch axis). Before trying backends, the
  ORIGINAL module is profiled at batch sizes 1, 2, 4, ... (batches made by repeating the largest recorded sample
  along the GraphSpec's batch axes, see `profiling.make_batch`) up to the largest recorded batch size - backends are
  built for the recorded range, so larger batches would not be served by them - and at most `max_batch_size`. The
  search stops when throughput stops improving (by `min_gain`, default 5 %) or the device runs out of memory. Each
  backend is then profiled at the batch size with the best eager throughput, and that eager measurement is the
  report's baseline (`TuneReport.eager_latency_ms`).
- **At recorded shapes** (`profile_at_recorded_shapes=True`, and automatically when the graph has no batch axis):
  for JIT tuning, where batches cannot be extrapolated. Every backend, and the original module as the baseline, is
  profiled on one real recorded sample: the most common input shapes among the samples (ties: the largest).

Each candidate is measured against the original module in interleaved rounds (`profiling.compare`: eager,
candidate, eager, candidate, ..., medians), so a busy machine slows both alike; its speedup is the smaller of
the median per-round ratio and the ratio of medians (`Comparison.speedup`), and candidates are ranked by it.
`TuneReport.speedup` = eager latency / selected latency of the selected candidate's comparison.

- `min_speedup=x` (the JIT default sets it): when the best candidate is not at least x times faster than eager,
  it is released and `NotFasterThanEagerError` (a `TuningFailedError`) is raised, so the caller keeps eager.
  Without it the strategy returns the best candidate and the caller decides (`TuneReport.beats_eager()`).
- `min_eager_latency_us=t`: when one eager call at the profiled shapes takes less than t microseconds, no
  backend is built: `NotFasterThanEagerError` says the module is too cheap to be worth a dispatch (a tuned
  call's dispatch plus a compiled function's entry cost about ten microseconds or more; a tiny Embedding or
  Linear cannot win that back).
- `stop_when_speedup_over=x` stops trying further backends once one is x times faster than eager.
- `budget_s`: seconds one interleaved comparison may take (default `profiling.settings.*_budget_s`).
- `skip_single_layer=True`: no backend is built for a module that is one torch.nn layer (a Linear, an Embedding,
  a LayerNorm, or a module whose only submodule is one; `cost_model.single_torch_layer`): a compiler runs the
  same library kernel for it, so it can only lose by the dispatch.
- `dispatch_overhead_us`: the caller's fixed cost of routing a call to a backend, added to every candidate
  latency, so that a candidate that wins by less than that cost is not chosen. When it is set, the cost of
  matching the timed call to its graph (`GraphSpec.accepts`, which grows with the arguments: a dict of inputs
  costs more than one tensor) is measured and added too.

A graph whose calls change their arguments (a decoder's KV cache) is timed on fresh copies of them per call
(`profiling.FreshInputs`) and only at the recorded shapes. The module passed in must be callable without being
recorded again (the callers pass the module with its original forward).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from aitune_core import profiling
from aitune_core.backends.backend import Backend
from aitune_core.errors import NotFasterThanEagerError
from aitune_core.log import get_logger
from aitune_core.recording.sample import replay_device
from aitune_core.specs.replay_state import replaying
from aitune_core.specs.tree import tree_map
from aitune_core.strategies.cost_model import single_torch_layer
from aitune_core.strategies.strategy import CandidateReport, TuneReport, TuneStrategy

if TYPE_CHECKING:
    from aitune_core.recording.sample import Sample
    from aitune_core.specs.graph_spec import GraphSpec
    from aitune_core.strategies.tune_job import TuneJob

_logger = get_logger("strategy")


def _to_device(value: Any, device: torch.device) -> Any:
    return tree_map(lambda t: t.to(replay_device(t, device)), value)


class HighestThroughputStrategy(TuneStrategy):
    """Evaluate every backend and return the one with the highest throughput; see the module docstring.

    Args:
        backends: candidates in the order they are tried (default: `default_backends()` + `TorchEagerBackend()`).
        max_batch_size: upper bound of the batch-size search (default 64).
        profile_at_recorded_shapes: profile on a recorded sample instead of an estimated batch size (JIT). None
            (default) means False, except for graphs without a batch axis.
        stop_when_speedup_over: stop trying backends once one is this many times faster than eager.
        min_gain: relative throughput gain below which the batch-size search stops (default 0.05).
        min_speedup: keep eager (raise `NotFasterThanEagerError`) unless the best candidate is this many times
            faster than eager.
        min_eager_latency_us: build nothing for modules whose eager call takes less (microseconds).
        budget_s: time budget of one interleaved eager-vs-candidate comparison (seconds).
        dispatch_overhead_us: added to each candidate latency before the speedup is computed: the caller's cost
            of routing a call to a backend, which the candidate's own measurement does not include.
        skip_single_layer: build nothing for a module that is one torch.nn layer (`cost_model`).
        warmup, iterations: override `profiling.settings` for this strategy's measurements.
    """

    display_name = "Highest Throughput Strategy"
    description = "evaluate all backends, return backend with highest throughput"
    measures_speed = True

    def __init__(
        self,
        backends: Sequence[Backend] | None = None,
        *,
        max_batch_size: int = 64,
        profile_at_recorded_shapes: bool | None = None,
        stop_when_speedup_over: float | None = None,
        min_gain: float = 0.05,
        min_speedup: float | None = None,
        min_eager_latency_us: float | None = None,
        budget_s: float | None = None,
        dispatch_overhead_us: float | None = None,
        skip_single_layer: bool = False,
        warmup: int | None = None,
        iterations: int | None = None,
    ) -> None:
        super().__init__(backends)
        for label, value in (("min_speedup", min_speedup), ("min_eager_latency_us", min_eager_latency_us),
                             ("budget_s", budget_s), ("dispatch_overhead_us", dispatch_overhead_us)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0):
                raise ValueError(f"{label} must be a number >= 0 or None, got {value!r}")
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size must be an int >= 1, got {max_batch_size!r}")
        if stop_when_speedup_over is not None and not stop_when_speedup_over > 0:  # (NaN is refused too)
            raise ValueError(f"stop_when_speedup_over must be > 0, got {stop_when_speedup_over!r}")
        if not min_gain >= 0:
            raise ValueError(f"min_gain must be >= 0, got {min_gain!r}")
        self.max_batch_size = max_batch_size
        self.profile_at_recorded_shapes = profile_at_recorded_shapes
        self.stop_when_speedup_over = stop_when_speedup_over
        self.min_gain = min_gain
        self.min_speedup = min_speedup
        self.min_eager_latency_us = min_eager_latency_us
        self.budget_s = budget_s
        self.dispatch_overhead_us = dispatch_overhead_us
        self.skip_single_layer = bool(skip_single_layer)
        self.warmup = warmup
        self.iterations = iterations

    @classmethod
    def default_backends(cls) -> list[Backend]:
        """`default_backends()` plus `TorchEagerBackend()`: without `min_speedup` the original module can win."""
        from aitune_core.backends.defaults import default_backends
        from aitune_core.backends.torch_eager import TorchEagerBackend

        return [*default_backends(), TorchEagerBackend()]

    # ------------------------------------------------------------------------------------------ measuring
    def _profile(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], batch_size: int,
                 device: torch.device) -> profiling.Measurement:
        return profiling.profile(
            fn, args, kwargs, batch_size=batch_size, device=device, warmup=self.warmup, iterations=self.iterations
        )

    def _too_cheap(self, name: str, eager: profiling.Measurement) -> str | None:
        threshold = self.min_eager_latency_us
        if threshold is not None and eager.latency_ms * 1000.0 < threshold:
            return (
                f"module `{name}` takes {eager.latency_ms * 1000.0:.1f} us per eager call, below "
                f"min_eager_latency_us={threshold:g}: too cheap to be worth a dispatch"
            )
        return None

    def _single_layer(self, module: Any, name: str) -> str | None:
        layer = single_torch_layer(module) if self.skip_single_layer else None
        if layer is None:
            return None
        return (
            f"module `{name}` is one torch.nn layer ({layer}): one library kernel, nothing for a compiler to "
            "fuse, not worth a dispatch (skip_single_layer)"
        )

    def skip_reason(self, job: TuneJob) -> str | None:
        """Why no backend is worth building for this graph (`skip_single_layer`, `min_eager_latency_us`), or None.

        Cheap (no compile; a few eager calls at a recorded shape when `min_eager_latency_us` is set), so a
        caller can ask before costlier checks such as a dynamo trace; `run` applies the same checks itself.
        """
        module, name, graph_spec, data, device, _cache_dir = job.arguments()
        reason = self._single_layer(module, name)
        if reason is not None or self.min_eager_latency_us is None or not data:
            return reason
        sample = self._representative_sample(graph_spec, data)
        args, kwargs = sample.inputs_to(device)
        batch_size = profiling.sample_batch_size(graph_spec, sample) or 1
        with replaying(graph_spec):  # timed as the program calls it
            eager = self._profile(_on_sample(module, sample, device), args, kwargs, batch_size, device)
        return self._too_cheap(name, eager)

    def _not_faster(self, name: str, graph_spec: GraphSpec, candidates: list[CandidateReport],
                    best: CandidateReport, speedup: float) -> NotFasterThanEagerError:
        error = NotFasterThanEagerError(
            f"no backend is at least {self.min_speedup:g}x faster than eager for module `{name}` "
            f"(graph {graph_spec.name}): best {best.description} at {speedup:.2f}x (measured interleaved)"
        )
        error.candidates = candidates  # type: ignore[attr-defined]
        return error

    @staticmethod
    def _representative_sample(graph_spec: GraphSpec, data: list[Sample]) -> Sample:
        """The sample with the most common input shapes (ties: the largest inputs)."""
        shapes: list[tuple[tuple[int, ...], ...]] = []
        sizes: list[int] = []
        for sample in data:
            try:
                tensors = graph_spec.input_tensors(sample.args, sample.kwargs)
            except Exception:
                tensors = []
            shapes.append(tuple(tuple(t.shape) for t in tensors))
            sizes.append(sum(t.numel() for t in tensors))
        counts = Counter(shapes)
        best = max(range(len(data)), key=lambda i: (counts[shapes[i]], sizes[i], -i))
        return data[best]

    @staticmethod
    def _largest_batch_sample(graph_spec: GraphSpec, data: list[Sample]) -> Sample:
        return max(data, key=lambda s: profiling.sample_batch_size(graph_spec, s) or 0)

    def _batch_sizes(self, graph_spec: GraphSpec, data: list[Sample]) -> list[int]:
        """Powers of two inside the recorded batch range (plus its ends), capped by `max_batch_size`.

        The range is that of the samples' batch sizes (the unit `make_batch` counts in), falling back to the
        first batch axis of the GraphSpec.
        """
        recorded_sizes = [profiling.sample_batch_size(graph_spec, sample) for sample in data]
        known = [size for size in recorded_sizes if size]
        recorded = (min(known), max(known)) if known else profiling.batch_range(graph_spec)
        if recorded is None:
            return [1]
        low, high = recorded
        high = max(low, min(self.max_batch_size, high)) if self.max_batch_size >= low else low
        sizes = {low, high}
        n = 1
        while n < high:
            if n > low:
                sizes.add(n)
            n *= 2
        return sorted(sizes)

    def _estimate_batch_size(
        self, module: Any, graph_spec: GraphSpec, data: list[Sample], sample: Sample, device: torch.device
    ) -> tuple[int, profiling.Measurement | None]:
        """Profile the original module at growing batch sizes; return the best one and its measurement."""
        best: profiling.Measurement | None = None
        for batch_size in self._batch_sizes(graph_spec, data):
            args, kwargs = profiling.make_batch(sample, graph_spec, batch_size)
            args, kwargs = _to_device(args, device), _to_device(kwargs, device)
            try:
                measurement = self._profile(module, args, kwargs, batch_size, device)
            except Exception as exc:
                if profiling.is_out_of_memory(exc):
                    _logger.info("📏 batch size %d: out of memory, stopping the search", batch_size)
                    del args, kwargs
                    if torch.cuda.is_available():
                        torch.cuda.empty_cache()
                    break
                raise
            _logger.info(
                "📏 batch size %d: throughput %.2f samples/s (original module, latency %.3f ms)",
                batch_size,
                measurement.throughput,
                measurement.latency_ms,
            )
            if best is not None and measurement.throughput < best.throughput * (1.0 + self.min_gain):
                if measurement.throughput > best.throughput:
                    best = measurement
                break
            best = measurement
        if best is None:
            return 1, None
        _logger.info("📏 estimated max batch size: %d", best.batch_size)
        return best.batch_size, best

    # ------------------------------------------------------------------------------------------ tuning
    def _tune_job(self, job: TuneJob) -> TuneReport:
        module, name, graph_spec, data, device, _cache_dir = job.arguments()
        reason = self._single_layer(module, name)
        if reason is not None:
            raise NotFasterThanEagerError(f"{reason}; nothing was built")
        # a stateful call (its arguments hold a cache sized to the recorded batch) is only timed as recorded
        stateful = any(sample.mutates_inputs for sample in data)
        at_recorded = bool(self.profile_at_recorded_shapes) or not graph_spec.has_batch_axis() or stateful
        replayed: Sample | None = None
        if at_recorded:
            sample = replayed = self._representative_sample(graph_spec, data)
            args, kwargs = sample.inputs_to(device)
            batch_size = profiling.sample_batch_size(graph_spec, sample) or 1
            _logger.info("📏 profiling at recorded shapes, batch size %d", batch_size)
            eager = self._profile(_on_sample(module, sample, device), args, kwargs, batch_size, device)
        else:
            sample = self._largest_batch_sample(graph_spec, data)
            batch_size, eager = self._estimate_batch_size(module, graph_spec, data, sample, device)
            args, kwargs = profiling.make_batch(sample, graph_spec, batch_size)
            args, kwargs = _to_device(args, device), _to_device(kwargs, device)
        if eager is not None:
            _logger.info(
                "📏 original module: throughput %.2f samples/s, batch size %d (latency %.3f ms)",
                eager.throughput,
                eager.batch_size,
                eager.latency_ms,
            )
            reason = self._too_cheap(name, eager)
            if reason is not None:
                raise NotFasterThanEagerError(f"{reason}; nothing was built")

        match_ms = _match_cost_ms(graph_spec, args, kwargs) if self.dispatch_overhead_us is not None else 0.0
        speedups: dict[int, float] = {}  # id(CandidateReport) -> speedup over eager, measured interleaved
        baselines: dict[int, float] = {}  # id(CandidateReport) -> eager median of the same comparison
        pending: list[tuple[float, float]] = []  # what `profile` measured, until `keep_best` files it

        def profile(backend: Backend) -> profiling.Measurement:
            fns = [module, backend.infer]
            if replayed is not None:
                fns = [_on_sample(fn, replayed, device) for fn in fns]
            comparison = profiling.compare(fns, args, kwargs, device=device, warmup=self.warmup, budget_s=self.budget_s)
            extra_ms = (self.dispatch_overhead_us or 0.0) / 1000.0 + match_ms
            speedup = comparison.speedup(1, extra_ms=extra_ms)
            pending.append((speedup, comparison.baseline_ms))
            _logger.info(
                "📏 interleaved with eager (%d rounds x %d calls): eager %.3f ms, candidate %.3f ms "
                "(+%.3f ms dispatch) -> %.2fx",
                comparison.rounds,
                comparison.calls_per_round,
                comparison.baseline_ms,
                comparison.latencies_ms[1],
                extra_ms,
                speedup,
            )
            return profiling.Measurement(comparison.latencies_ms[1] + extra_ms, batch_size, comparison.rounds)

        candidates: list[CandidateReport] = []
        best: list[Any] = [None, None]  # [backend, report]

        def keep_best(report: CandidateReport, backend: Backend) -> None:
            if pending:
                speedups[id(report)], baselines[id(report)] = pending.pop()
            best_report = best[1]
            if best_report is None or speedups.get(id(report), 0.0) > speedups.get(id(best_report), 0.0):
                _logger.info(
                    "🎯 new best throughput for %s is %.2f samples/s, batch size: %d",
                    report.description,
                    report.throughput or 0.0,
                    batch_size,
                )
                self._discard(best[0])
                best[0], best[1] = backend, report
            else:
                self._discard(backend)

        for blueprint in self._backends:
            pending.clear()
            report, _backend = self._try_backend(blueprint, job, profile=profile, on_success=keep_best)
            candidates.append(report)
            best_report = best[1]
            best_speedup = speedups.get(id(best_report), 0.0) if best_report is not None else 0.0
            if self.stop_when_speedup_over is not None and best_speedup >= self.stop_when_speedup_over:
                _logger.info(
                    "🏁 %s is %.2fx faster than eager (>= %.2fx): not trying the remaining backends",
                    best_report.description,
                    best_speedup,
                    self.stop_when_speedup_over,
                )
                break
        best_backend, best_report = best
        selected_index = next((i for i, c in enumerate(candidates) if c is best_report), None)
        if best_backend is None or best_report is None:
            raise self._failed(name, graph_spec, candidates)
        best_speedup = speedups.get(id(best_report))
        if self.min_speedup is not None and best_speedup is not None and best_speedup < self.min_speedup:
            self._discard(best_backend)
            raise self._not_faster(name, graph_spec, candidates, best_report, best_speedup)
        eager_ms = baselines.get(id(best_report), eager.latency_ms if eager is not None else None)
        return TuneReport(
            backend=best_backend,
            candidates=candidates,
            eager_latency_ms=eager_ms,
            selected_latency_ms=best_report.latency_ms,
            batch_size=batch_size,
            selected_index=selected_index,
        )


def _match_cost_ms(graph_spec: GraphSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> float:
    """The median time (ms) `graph_spec.accepts` takes for these inputs: part of every dispatched call's cost."""
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(20):
            graph_spec.accepts(args, kwargs)
        rounds.append((time.perf_counter() - start) * 1000.0 / 20)
    return statistics.median(rounds)


def _on_sample(fn: Callable[..., Any], sample: Sample, device: torch.device) -> Callable[..., Any]:
    """`fn` as timed on `sample`'s inputs: on fresh copies for each call when the sample is stateful (a replay
    changes its arguments; `profiling.FreshInputs`), else `fn` itself."""
    if not sample.mutates_inputs:
        return fn
    return profiling.FreshInputs(fn, lambda: sample.inputs_to(device))
