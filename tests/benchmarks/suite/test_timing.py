"""benchmarks/suite/timing.py: statistics, the time-to-steady rule, the serving loop, the error measure."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import pytest
import torch

from benchmarks.suite import timing


def test_summarize_median_percentiles():
    stats = timing.summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert stats.median_ms == 3.0
    assert stats.min_ms == 1.0
    assert stats.n == 5
    assert stats.p10_ms == pytest.approx(1.4)
    assert stats.p90_ms == pytest.approx(4.6)
    assert stats.mean_ms == pytest.approx(3.0)
    with pytest.raises(ValueError):
        timing.summarize([])


def test_throughput_is_samples_per_second():
    assert timing.throughput(32, 16.0) == pytest.approx(2000.0)


def test_compile_spike_sets_time_to_steady():
    # call 0 compiles (3 s), then 2 ms calls: steady from call 1, after the end of call 0
    warm = [3000.0] + [2.0] * 9
    assert timing.steady_index(warm, 2.0) == 1
    starts = [0.0, 3.0, *[3.0 + 0.002 * i for i in range(1, 9)]]
    ends = [3.0, *starts[2:], 3.02]
    assert timing.time_to_steady_s(starts, ends, warm, 2.0) == pytest.approx(3.0)


def test_sustained_slow_phase_counts_isolated_jitter_does_not():
    # eager phase at 4 ms, a tuning spike, tuned at 2 ms with one 3.5 ms blip (jitter) later on
    warm = [4.0] * 5 + [900.0] + [2.0] * 5 + [3.5] + [2.0] * 5
    assert timing.steady_index(warm, 2.0) == 6
    # without the spike, the sustained 4 ms phase still counts (two slow neighbours)
    assert timing.steady_index([4.0] * 5 + [2.0] * 5, 2.0) == 5
    # slow by ratio but under the 1 ms floor: sub-millisecond host noise
    assert timing.steady_index([0.5, 0.5, 0.2, 0.2], 0.2) == 0
    assert timing.steady_index([2.0] * 10, 2.0) == 0


def test_is_settled_ignores_isolated_blips():
    assert timing.is_settled([2.0] * 9 + [3.5] + [2.0] * 10, 20)
    assert not timing.is_settled([2.0] * 10 + [4.0, 4.0], 12)
    assert not timing.is_settled([2.0] * 3, 20)


def test_serve_loop_on_cpu_measures_a_slow_first_call():
    calls = []

    def fn(x):
        calls.append(x)
        if len(calls) == 1:
            time.sleep(0.3)  # a "compile" on the first call
        return x * 2

    result = timing.serve_loop(fn, [1, 2], "cpu", warmup=5, iters=10, settle=5, max_warmup_s=10)
    assert len(result.timed_ms) == 10
    assert len(calls) == len(result.warmup_ms) + 10
    assert calls[:4] == [1, 2, 1, 2]  # inputs rotate
    assert result.first_call_s >= 0.3
    assert result.time_to_steady_s == pytest.approx(result.first_call_s, rel=0.05)
    assert result.settled
    d = result.to_dict()
    assert d["stats"]["n"] == 10 and len(d["timed_ms"]) == 10


def test_warm_up_limit_counts_from_the_end_of_the_first_call(monkeypatch):
    # on a simulated clock: with real sleeps, a loaded machine stretched the 1 ms calls until a window of three
    # looked settled (the full suite failed this test once)
    clock = [0.0]
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    calls = []

    def fn(x):  # a slow first call (a compile), then latencies that never settle
        calls.append(x)
        clock[0] += 0.3 if len(calls) == 1 else (0.02 if len(calls) % 3 == 0 else 0.001)  # 1, 1, 20 ms...
        return x

    result = timing.serve_loop(fn, [1], "cpu", warmup=3, iters=2, settle=3, max_warmup_s=0.2)
    assert not result.settled
    assert len(result.warmup_ms) > 10  # it kept warming up for 0.2 s after the compile, not 3 calls


def test_serve_loop_keeps_timing_until_the_minimum_duration():
    def fn(x):
        time.sleep(0.01)
        return x

    result = timing.serve_loop(fn, [1], "cpu", warmup=2, iters=3, settle=2, max_warmup_s=5, min_timed_s=0.2)
    assert len(result.timed_ms) >= 15  # 0.2 s of 10 ms calls, well past the 3 asked for
    assert sum(result.timed_ms) >= 190
    short = timing.serve_loop(fn, [1], "cpu", warmup=2, iters=3, settle=2, max_warmup_s=5)
    assert len(short.timed_ms) == 3


def test_chunk_medians_follow_a_level_that_drifts_within_a_process():
    series = [2.0] * 10 + [1.0] * 10
    assert timing.chunk_medians(series, chunks=4) == [2.0, 2.0, 1.0, 1.0]
    assert timing.chunk_medians([], chunks=4) == []
    assert timing.chunk_medians([3.0], chunks=4) == [3.0]


def test_relative_error():
    ref = torch.tensor([3.0, 4.0])
    rel, max_abs = timing.relative_error(torch.tensor([3.0, 4.5]), ref)
    assert rel == pytest.approx(0.1)
    assert max_abs == pytest.approx(0.5)
    assert timing.relative_error(torch.tensor([float("nan"), 4.0]), ref) == (math.inf, math.inf)
    with pytest.raises(ValueError):
        timing.relative_error(torch.zeros(3), ref)
