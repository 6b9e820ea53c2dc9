"""Latency and throughput measurement, and batches of a chosen size made from a recorded sample.

`measure(fn, args, kwargs, device=...)` returns the median latency of one call in milliseconds:

- on CUDA, each call is bracketed by a pair of CUDA events on the current stream and the device is synchronized
  once at the end (the events give GPU-side time without a host sync per iteration); at most
  `settings.cuda_queued_calls` calls are queued ahead of the GPU (`gpu_backlog.CallBacklog`), so a serving
  thread's request is never queued behind a long run of them;
- on CPU, `time.perf_counter()` around each call.

Every call runs under `torch.no_grad()`. The number of calls is `warmup` (not timed), then at least
`iterations` timed calls and, if `min_time_s` is set, more calls until that much time was spent timing (capped
by `max_iterations`). The defaults differ per device and live in `settings`, a module-level `ProfileSettings` the
caller (or a test) may change:

    from aitune_core import profiling
    profiling.settings.cpu_iterations = 3

`compare(fns, args, kwargs)` measures several functions on the same inputs against the first one (the
baseline, e.g. the eager module) in ALTERNATING rounds: baseline, candidate, baseline, candidate, ... (the
order inside a round rotates). Each round's median is taken per function; `Comparison.speedup(i)` is the
smaller of the median over rounds of (baseline round median / candidate round median) and the ratio of the
overall medians. On a busy machine (other processes on
the same cores, frequency changes) load shifts over seconds; interleaving exposes every function to the same
load, and medians ignore the calls a preemption hit. The number of calls per round is chosen from a timed
call so that a round takes about `*_round_s`; rounds run until `*_budget_s` seconds were spent (at least
`min_rounds`, at most `max_rounds`), so a measurement is stable without taking unbounded time.

`make_batch(sample, graph_spec, batch_size)` makes the inputs of a call with another batch size from one
recorded sample by repeating it along the batch axes of the GraphSpec (indices `arange(new) % old`), which is how
`HighestThroughputStrategy` profiles at batch sizes that were never recorded. Only shapes matter for profiling;
the values are the recorded ones, repeated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from aitune_core.gpu_backlog import CallBacklog
from aitune_core.timed_section import timed

if TYPE_CHECKING:
    from aitune_core.recording.sample import Sample
    from aitune_core.specs.graph_spec import GraphSpec


@dataclasses.dataclass
class ProfileSettings:
    """Defaults of `measure` and `compare`, per device type. Keep the CPU ones small: CPU runs in tests and CI
    (a CPU comparison takes about `cpu_budget_s`, or `min_rounds` rounds of slow functions)."""

    cpu_warmup: int = 1
    cpu_iterations: int = 5
    cpu_min_time_s: float = 0.05
    cuda_warmup: int = 10
    cuda_iterations: int = 30
    cuda_min_time_s: float = 0.2
    max_iterations: int = 1000
    #: calls (timed or warm-up) queued ahead of the GPU at most; 0: unbounded (see `gpu_backlog`)
    cuda_queued_calls: int = 2
    #: `compare`: target duration of one function's share of a round, and the time budget of one comparison
    cpu_round_s: float = 0.02
    cpu_budget_s: float = 1.0
    cuda_round_s: float = 0.01
    cuda_budget_s: float = 0.5
    min_rounds: int = 5
    max_rounds: int = 200

    def for_device(self, device: torch.device) -> tuple[int, int, float]:
        if device.type == "cuda":
            return self.cuda_warmup, self.cuda_iterations, self.cuda_min_time_s
        return self.cpu_warmup, self.cpu_iterations, self.cpu_min_time_s


settings = ProfileSettings()


@dataclasses.dataclass(frozen=True)
class Measurement:
    """Result of `profile`: median latency of one call and the derived throughput (samples per second)."""

    latency_ms: float
    batch_size: int
    iterations: int

    @property
    def throughput(self) -> float:
        return throughput(self.batch_size, self.latency_ms)


def throughput(batch_size: int, latency_ms: float) -> float:
    """Samples per second for `batch_size` samples per call taking `latency_ms`."""
    return batch_size * 1000.0 / max(latency_ms, 1e-9)


@contextlib.contextmanager
def timing_unpaused() -> Iterator[None]:
    """A timed call runs without a profile or trace function that pauses this thread (`suspend_while_timing`,
    such as a background tuning job's, which waits while requests are served): a pause inside a timed call
    would be measured as the backend's time. Each call is marked on its own: between two timed calls the job
    may still step aside for a request (the measurement would otherwise run through requests, competing with
    them for the GIL and the device)."""
    # (a gate that runs without a profile or trace function reads the `timed` mark)
    with timed(), _without(sys.getprofile, sys.setprofile), _without(sys.gettrace, sys.settrace):
        yield


@contextlib.contextmanager
def _without(get: Callable[[], Any], put: Callable[[Any], None]) -> Iterator[None]:
    """This thread's profile or trace function, taken off for the block if it is a pausing gate."""
    hook = get()
    if not getattr(hook, "suspend_while_timing", False):
        yield
        return
    put(None)
    try:
        yield
    finally:
        put(hook)


def _resolve_device(device: torch.device | str | None, args: Sequence[Any], kwargs: Mapping[str, Any]) -> torch.device:
    if device is not None:
        return torch.device(device)
    from aitune_core.specs.tree import flatten_values

    leaves, _ = flatten_values((tuple(args), dict(kwargs)))
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            return leaf.device
    return torch.device("cpu")


class FreshInputs:
    """`fn` called on new inputs each time, for a call that changes its arguments (a decoder appending to its KV
    cache): timed on the same objects again and again, it would run on an ever longer cache. `make()` gives
    `(args, kwargs)`; the timing loops here call `prepare()` before each timed call, so the copy is not timed
    (on CUDA its work is queued before the start event); the arguments a caller passes are ignored."""

    def __init__(self, fn: Callable[..., Any], make: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]) -> None:
        self.fn, self.make = fn, make
        self._next: tuple[tuple[Any, ...], dict[str, Any]] | None = None

    def prepare(self) -> None:
        self._next = self.make()

    def __call__(self, *_args: Any, **_kwargs: Any) -> Any:
        args, kwargs = self._next if self._next is not None else self.make()
        self._next = None
        return self.fn(*args, **kwargs)


def _preparer(fn: Callable[..., Any]) -> Callable[[], None]:
    return getattr(fn, "prepare", None) or _nothing


def _nothing() -> None:
    return None


def measure_all(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    device: torch.device | str | None = None,
    warmup: int | None = None,
    iterations: int | None = None,
    min_time_s: float | None = None,
) -> list[float]:
    """Latencies (ms) of every timed call; see `measure`."""
    kwargs = dict(kwargs or {})
    dev = _resolve_device(device, args, kwargs)
    d_warmup, d_iterations, d_min_time = settings.for_device(dev)
    warmup = d_warmup if warmup is None else warmup
    iterations = d_iterations if iterations is None else iterations
    min_time_s = d_min_time if min_time_s is None else min_time_s
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    cuda = dev.type == "cuda" and torch.cuda.is_available()
    prepare = _preparer(fn)

    with torch.no_grad():
        backlog = CallBacklog(settings.cuda_queued_calls if cuda else 0)
        for _ in range(max(warmup, 0)):  # (not timed: the job may step aside inside these)
            backlog.before_call()
            fn(*args, **kwargs)
            backlog.after_call()
        if cuda:
            with torch.cuda.device(dev):
                torch.cuda.synchronize()
                events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
                start_wall = time.perf_counter()
                while len(events) < settings.max_iterations and (
                    len(events) < iterations or time.perf_counter() - start_wall < min_time_s
                ):
                    events.append(_cuda_call(fn, args, kwargs, prepare, backlog))
                    if min_time_s and len(events) >= iterations and len(events) % iterations == 0:
                        torch.cuda.synchronize()  # so that the wall clock check sees finished work
                torch.cuda.synchronize()
                return [b.elapsed_time(e) for b, e in events]
        latencies: list[float] = []
        start_wall = time.perf_counter()
        while len(latencies) < settings.max_iterations and (
            len(latencies) < iterations or time.perf_counter() - start_wall < min_time_s
        ):
            latencies.append(_host_call(fn, args, kwargs, prepare))
        return latencies


def _cuda_call(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any],
               prepare: Callable[[], None], backlog: CallBacklog) -> tuple[torch.cuda.Event, torch.cuda.Event]:
    """One call bracketed by CUDA events; its inputs are prepared first, outside the bracket, once fewer than
    `backlog.depth` earlier calls are still queued (the wait is outside the bracket too)."""
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    backlog.before_call()
    prepare()
    with timing_unpaused():
        begin.record()
        fn(*args, **kwargs)
        end.record()
    backlog.after_call(end)
    return begin, end


def _host_call(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any],
               prepare: Callable[[], None]) -> float:
    """One call's wall time in ms; its inputs are prepared first, outside the timing."""
    prepare()
    with timing_unpaused():
        t0 = time.perf_counter()
        fn(*args, **kwargs)
        return (time.perf_counter() - t0) * 1000.0


def measure(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    device: torch.device | str | None = None,
    warmup: int | None = None,
    iterations: int | None = None,
    min_time_s: float | None = None,
) -> float:
    """Median latency of `fn(*args, **kwargs)` in milliseconds (device from the tensors when not given)."""
    return statistics.median(
        measure_all(fn, args, kwargs, device=device, warmup=warmup, iterations=iterations, min_time_s=min_time_s)
    )


def profile(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    batch_size: int = 1,
    device: torch.device | str | None = None,
    warmup: int | None = None,
    iterations: int | None = None,
    min_time_s: float | None = None,
) -> Measurement:
    """`measure` plus throughput for `batch_size` samples per call."""
    latencies = measure_all(
        fn, args, kwargs, device=device, warmup=warmup, iterations=iterations, min_time_s=min_time_s
    )
    return Measurement(statistics.median(latencies), batch_size, len(latencies))


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Result of `compare`, per function (baseline first): the median latency over every timed call and the
    median of each round (`round_medians_ms[f][r]`)."""

    latencies_ms: tuple[float, ...]
    round_medians_ms: tuple[tuple[float, ...], ...]
    rounds: int
    calls_per_round: int

    @property
    def baseline_ms(self) -> float:
        return self.latencies_ms[0]

    def speedup(self, index: int, extra_ms: float = 0.0) -> float:
        """Speedup of function `index` over the baseline, conservatively: the smaller of the median per-round
        ratio (baseline round median / its round median) and the ratio of overall medians. `extra_ms` is added
        to each of its latencies first (a cost the measured function does not include, e.g. a dispatch)."""
        baseline = self.round_medians_ms[0]
        paired = statistics.median(
            b / max(c + extra_ms, 1e-9) for b, c in zip(baseline, self.round_medians_ms[index])
        )
        overall = self.baseline_ms / max(self.latencies_ms[index] + extra_ms, 1e-9)
        return min(paired, overall)


def _timed_calls(fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], count: int,
                 cuda: bool) -> list[float]:
    """Latencies (ms) of `count` calls; on CUDA bracketed by events and synchronized once at the end."""
    prepare = _preparer(fn)
    if cuda:
        backlog = CallBacklog(settings.cuda_queued_calls)
        events = [_cuda_call(fn, args, kwargs, prepare, backlog) for _ in range(count)]
        torch.cuda.synchronize()
        return [b.elapsed_time(e) for b, e in events]
    return [_host_call(fn, args, kwargs, prepare) for _ in range(count)]


def compare(
    fns: Sequence[Callable[..., Any]],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    device: torch.device | str | None = None,
    warmup: int | None = None,
    budget_s: float | None = None,
    min_rounds: int | None = None,
) -> Comparison:
    """Measure `fns` (the first is the baseline) in interleaved rounds on the same inputs; see the module
    docstring. Every call runs under `torch.no_grad()`."""
    if not fns:
        raise ValueError("compare needs at least one function")
    kwargs = dict(kwargs or {})
    dev = _resolve_device(device, args, kwargs)
    cuda = dev.type == "cuda" and torch.cuda.is_available()
    d_warmup, _iterations, _min_time = settings.for_device(dev)
    warmup = d_warmup if warmup is None else warmup
    round_s = settings.cuda_round_s if cuda else settings.cpu_round_s
    budget_s = (settings.cuda_budget_s if cuda else settings.cpu_budget_s) if budget_s is None else budget_s
    min_rounds = max(1, settings.min_rounds if min_rounds is None else min_rounds)
    context = torch.cuda.device(dev) if cuda else contextlib.nullcontext()
    with torch.no_grad(), context:
        for fn in fns:
            _timed_calls(fn, args, kwargs, max(warmup, 0), cuda)
        # one timed call each (the slowest decides) sets how many calls make a round of about `round_s`
        slowest_ms = max(_timed_calls(fn, args, kwargs, 1, cuda)[0] for fn in fns)
        calls = int(min(100, max(1, round_s * 1000.0 / max(slowest_ms, 1e-6))))
        per_fn: list[list[float]] = [[] for _ in fns]
        round_medians: list[list[float]] = [[] for _ in fns]
        start = time.perf_counter()
        rounds = 0
        while rounds < settings.max_rounds and (rounds < min_rounds or time.perf_counter() - start < budget_s):
            order = list(range(len(fns)))
            shift = rounds % len(fns)
            for index in order[shift:] + order[:shift]:
                latencies = _timed_calls(fns[index], args, kwargs, calls, cuda)
                per_fn[index] += latencies
                round_medians[index].append(statistics.median(latencies))
            rounds += 1
    return Comparison(
        tuple(statistics.median(lat) for lat in per_fn), tuple(tuple(m) for m in round_medians), rounds, calls
    )


def is_out_of_memory(exc: BaseException) -> bool:
    """True for CUDA (or host) out-of-memory errors, which end a batch-size search instead of failing it."""
    if isinstance(exc, torch.cuda.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


# ------------------------------------------------------------------------------------------- batches
def _input_leaves(graph_spec: GraphSpec, sample: Sample) -> tuple[list[Any], Any, Any]:
    """The flattened bound inputs of `sample`: (leaf values, treedef, binder)."""
    from aitune_core.specs.tree import flatten_values

    binder = graph_spec.binder
    bound = binder.bind(sample.args, sample.kwargs)
    values, treedef = flatten_values(bound)
    return values, treedef, binder


def sample_batch_size(graph_spec: GraphSpec, sample: Sample) -> int | None:
    """Batch size of a recorded sample: `sample.batch_size`, else the size of the first batch axis of its inputs."""
    if sample.batch_size:
        return int(sample.batch_size)
    values, _, _ = _input_leaves(graph_spec, sample)
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    for spec, tensor in zip(graph_spec.input_spec.tensors, tensors):
        axes = spec.batch_axes()
        if axes:
            return int(tensor.shape[axes[0]])
    return None


def batch_range(graph_spec: GraphSpec) -> tuple[int, int] | None:
    """(min, max) recorded size of the first batch axis of the inputs, or None when there is no batch axis."""
    for spec in graph_spec.input_spec.tensors:
        axes = spec.batch_axes()
        if axes:
            return spec.min_shape[axes[0]], spec.max_shape[axes[0]]
    return None


def _resize_axis(tensor: torch.Tensor, axis: int, old_batch: int, new_batch: int) -> torch.Tensor:
    size = tensor.shape[axis]
    if size == 0 or old_batch <= 0:
        return tensor
    # an axis may hold k samples per batch item (e.g. batch * heads): keep the ratio when it divides
    new_size = size * new_batch // old_batch if size % old_batch == 0 else max(1, round(size * new_batch / old_batch))
    if new_size == size:
        return tensor
    index = torch.arange(new_size, device=tensor.device) % size
    return tensor.index_select(axis, index)


def make_batch(sample: Sample, graph_spec: GraphSpec, batch_size: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Inputs `(args, kwargs)` of a call with `batch_size` items, made by repeating `sample` along batch axes."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    old_batch = sample_batch_size(graph_spec, sample) if graph_spec.has_batch_axis() else None
    if old_batch is None:
        raise ValueError(f"graph {graph_spec.name} has no batch axis; cannot make a batch of size {batch_size}")
    values, treedef, binder = _input_leaves(graph_spec, sample)
    from aitune_core.specs.tree import unflatten

    specs = iter(graph_spec.input_spec.tensors)
    new_values = []
    for value in values:
        if isinstance(value, torch.Tensor):
            spec = next(specs)
            for axis in spec.batch_axes():
                value = _resize_axis(value, axis, old_batch, batch_size)
        new_values.append(value)
    bound = unflatten(treedef, new_values)
    args, kwargs = binder.unbind(bound)
    return tuple(args), dict(kwargs)
