"""Latency measurement shared by every contender: a serving loop timed call by call, and pure statistics.

Plain PyTorch only (no aitune import): the workload script times itself with this module, so the JIT
contender (in a subprocess) and the in-process contenders are measured by the same code.

One call = `fn(batch)` followed by a device synchronisation, as a server does before it answers a
request. On CUDA each call is timed with a pair of CUDA events; on CPU with `time.perf_counter`. Every
call also records host wall-clock start/end stamps, from which the time to steady state is derived.

The loop has two phases:
  warm-up   at least `warmup` calls, then more until the last `settle` calls are stable (each within
            `threshold` x their own median) or `max_warmup_s` has passed since the first call returned
            (a compile in the first call, minutes for max-autotune, does not eat the settling time).
            Compiles, JIT tuning and recompiles happen here.
  timed     `iters` further calls, and more until they have taken `min_timed_s` of wall time; their
            median is the reported latency. At small batches a call costs well under a millisecond and the
            host decides the latency; its speed drifts over seconds (on one H200 host, 2026-11-21, a
            process's level moved by up to 25% within 3 s), so 100 calls - a tenth of a second - are a
            sample of one moment. A floor of seconds makes every contender's median span the drift.

Time to steady state (`time_to_steady_s`, reported for the JIT as time-to-tuned): the wall time from the
start of the first call to the end of the last warm-up call whose latency exceeds `threshold` (1.5) x the
final median (the median of the timed calls); 0 when no warm-up call was that slow. Host jitter is kept
out by `slow_calls`: a slow call must also be at least 1 ms over the median, and an isolated one counts
only as a spike over 5x the median (a compile or tuning step). It needs nothing from inside the
contender, so it measures aitune's JIT and torch.compile alike from the outside.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

STEADY_THRESHOLD = 1.5
JITTER_FLOOR_MS = 1.0
SPIKE_FACTOR = 5.0


@dataclasses.dataclass
class Stats:
    median_ms: float
    mean_ms: float
    p10_ms: float
    p90_ms: float
    min_ms: float
    n: int

    def to_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def chunk_medians(series: Sequence[float] | None, chunks: int = 10) -> list[float]:
    """Medians of `chunks` consecutive slices of a timed series: a level that drifts within one process (a
    transient after compiling, the host's speed moving) shows here; a level fixed per process does not."""
    if not series:
        return []
    size = max(1, len(series) // chunks)
    return [statistics.median(series[i:i + size]) for i in range(0, size * min(chunks, len(series)), size)]


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(latencies_ms: Sequence[float]) -> Stats:
    if not latencies_ms:
        raise ValueError("no latencies to summarize")
    return Stats(
        median_ms=statistics.median(latencies_ms),
        mean_ms=statistics.fmean(latencies_ms),
        p10_ms=percentile(latencies_ms, 10),
        p90_ms=percentile(latencies_ms, 90),
        min_ms=min(latencies_ms),
        n=len(latencies_ms),
    )


def throughput(batch: int, median_ms: float) -> float:
    """Samples per second at one call per `median_ms`."""
    return batch * 1000.0 / median_ms


def is_settled(latencies_ms: Sequence[float], settle: int, threshold: float = STEADY_THRESHOLD) -> bool:
    """True when none of the last `settle` latencies is slow (see slow_calls) against their own median."""
    if len(latencies_ms) < settle:
        return False
    tail = latencies_ms[-settle:]
    return not any(slow_calls(tail, statistics.median(tail), threshold))


def slow_calls(warmup_ms: Sequence[float], final_median_ms: float, threshold: float = STEADY_THRESHOLD) -> list[bool]:
    """Which warm-up calls count as not yet steady.

    A call is slow when it takes more than `threshold` x the final median and at least JITTER_FLOOR_MS more.
    A slow call counts when it is a spike (more than SPIKE_FACTOR x the median: a compile or a tuning step)
    or has a slow neighbour (a sustained slower phase, such as eager calls before tuning); an isolated
    slow call below SPIKE_FACTOR x is host jitter (a GC pause, a scheduler hiccup) and does not count.
    """
    slow = [x > threshold * final_median_ms and x - final_median_ms >= JITTER_FLOOR_MS for x in warmup_ms]
    counted = []
    for i, x in enumerate(warmup_ms):
        neighbour = (i > 0 and slow[i - 1]) or (i + 1 < len(slow) and slow[i + 1])
        counted.append(slow[i] and (x > SPIKE_FACTOR * final_median_ms or neighbour))
    return counted


def steady_index(warmup_ms: Sequence[float], final_median_ms: float, threshold: float = STEADY_THRESHOLD) -> int:
    """Index of the first warm-up call after the last slow one (see slow_calls); 0 when none was slow."""
    counted = slow_calls(warmup_ms, final_median_ms, threshold)
    for i in range(len(counted) - 1, -1, -1):
        if counted[i]:
            return i + 1
    return 0


def time_to_steady_s(
    starts_s: Sequence[float], ends_s: Sequence[float], warmup_ms: Sequence[float], final_median_ms: float,
    threshold: float = STEADY_THRESHOLD,
) -> float:
    """Wall seconds from the first call's start to the end of the last slow warm-up call (0 if none)."""
    idx = steady_index(warmup_ms, final_median_ms, threshold)
    return 0.0 if idx == 0 else ends_s[idx - 1] - starts_s[0]


@dataclasses.dataclass
class ServeResult:
    warmup_ms: list[float]
    timed_ms: list[float]
    starts_s: list[float]  # perf_counter at each call's start (warm-up then timed)
    ends_s: list[float]  # perf_counter after each call's synchronisation
    stats: Stats
    first_call_s: float
    time_to_steady_s: float
    settled: bool  # the warm-up ended because latencies were stable, not because of max_warmup_s
    slow_timed_calls: int  # timed calls slower than threshold x median: a late tune/recompile shows here

    def to_dict(self, keep_series: bool = True) -> dict[str, Any]:
        d = {
            "stats": self.stats.to_dict(),
            "first_call_s": self.first_call_s,
            "time_to_steady_s": self.time_to_steady_s,
            "settled": self.settled,
            "slow_timed_calls": self.slow_timed_calls,
            "n_warmup": len(self.warmup_ms),
        }
        if keep_series:
            d["warmup_ms"] = [round(x, 4) for x in self.warmup_ms]
            d["timed_ms"] = [round(x, 4) for x in self.timed_ms]
        return d


class _Timer:
    """Times one synchronous call: CUDA events on a CUDA device, perf_counter otherwise."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable[[], Any]) -> tuple[float, float, float, Any]:
        if self.cuda:
            start_ev = torch.cuda.Event(enable_timing=True)
            end_ev = torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            start_ev.record()
            out = fn()
            end_ev.record()
            end_ev.synchronize()
            t1 = time.perf_counter()
            return start_ev.elapsed_time(end_ev), t0, t1, out
        t0 = time.perf_counter()
        out = fn()
        t1 = time.perf_counter()
        return (t1 - t0) * 1000.0, t0, t1, out


def serve_loop(
    fn: Callable[[Any], Any],
    inputs: Sequence[Any],
    device: torch.device | str,
    *,
    warmup: int = 20,
    iters: int = 100,
    settle: int = 20,
    max_warmup_s: float = 120.0,
    threshold: float = STEADY_THRESHOLD,
    min_timed_s: float = 0.0,
) -> ServeResult:
    """Call `fn(inputs[i % len(inputs)])` through a warm-up and a timed phase (see the module docstring)."""
    device = torch.device(device)
    timer = _Timer(device)
    warm, starts, ends = [], [], []
    i = 0
    while True:
        ms, t0, t1, _ = timer(lambda i=i: fn(inputs[i % len(inputs)]))
        warm.append(ms)
        starts.append(t0)
        ends.append(t1)
        i += 1
        if i >= warmup and is_settled(warm, settle, threshold):
            settled = True
            break
        if i >= warmup and time.perf_counter() - ends[0] > max_warmup_s:
            settled = False
            break
    timed = []
    timed_start = time.perf_counter()
    while len(timed) < iters or time.perf_counter() - timed_start < min_timed_s:
        ms, t0, t1, _ = timer(lambda i=i: fn(inputs[i % len(inputs)]))
        timed.append(ms)
        starts.append(t0)
        ends.append(t1)
        i += 1
    stats = summarize(timed)
    limit = threshold * stats.median_ms
    return ServeResult(
        warmup_ms=warm,
        timed_ms=timed,
        starts_s=starts,
        ends_s=ends,
        stats=stats,
        first_call_s=ends[0] - starts[0],
        time_to_steady_s=time_to_steady_s(starts, ends, warm, stats.median_ms, threshold),
        settled=settled,
        slow_timed_calls=sum(1 for x in timed if x > limit),
    )


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(||out - ref|| / ||ref||, max |out - ref|), computed in float64 on the CPU; NaN/Inf give inf."""
    a = out.detach().to("cpu", torch.float64)
    b = ref.detach().to("cpu", torch.float64)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: {tuple(a.shape)} vs reference {tuple(b.shape)}")
    if not torch.isfinite(a).all():
        return math.inf, math.inf
    diff = a - b
    denom = b.norm().item()
    rel = diff.norm().item() / denom if denom > 0 else diff.norm().item()
    return rel, diff.abs().max().item()


def median_ms(fn: Callable[..., Any], batch: Any, device: str, iters: int, autocast: str = "none") -> float:
    """Median of `iters` timed synchronous calls of `fn(*batch.args, **batch.kwargs)` after a settled warm-up
    (CUDA events on a GPU): the probes' one-number timing of a call path."""
    from benchmarks.suite import models

    call = models.caller(fn, torch.device(device).type, autocast)
    with torch.no_grad():
        result = serve_loop(call, [batch], device, warmup=20, iters=iters, settle=20)
    return result.stats.median_ms
