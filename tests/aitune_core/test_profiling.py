import itertools
import time

import pytest
import torch
from core_fakes import TinyMLP, record

from aitune_core import profiling
from aitune_core.profiling import batch_range, make_batch, measure, profile, sample_batch_size, throughput
from aitune_core.recording.graph_recorder import GraphRecorder


def test_measure_returns_the_median_in_ms():
    delays = iter([0.02, 0.001, 0.001, 0.001, 0.02, 0.001])

    def fn():
        time.sleep(next(delays, 0.001))

    latency = measure(fn, device="cpu", warmup=1, iterations=5)
    assert 0.5 < latency < 10


def test_settings_are_configurable(monkeypatch):
    calls = []
    monkeypatch.setattr(profiling.settings, "cpu_warmup", 2)
    monkeypatch.setattr(profiling.settings, "cpu_iterations", 3)
    monkeypatch.setattr(profiling.settings, "cpu_min_time_s", 0.0)
    result = profile(lambda: calls.append(1), batch_size=4)
    assert len(calls) == 5 and result.iterations == 3
    assert result.throughput == pytest.approx(throughput(4, result.latency_ms))
    with pytest.raises(ValueError):
        measure(lambda: None, iterations=0)


def test_min_time_adds_iterations():
    result = profile(lambda: time.sleep(0.002), device="cpu", warmup=0, iterations=1, min_time_s=0.02)
    assert result.iterations >= 5


def test_out_of_memory_detection():
    assert profiling.is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate"))
    assert profiling.is_out_of_memory(MemoryError())
    assert not profiling.is_out_of_memory(RuntimeError("shape mismatch"))


def test_make_batch_repeats_along_batch_axes():
    model = TinyMLP().eval()
    spec, data = record(model, batch_sizes=(2, 4))
    assert batch_range(spec) == (2, 4)
    sample = data[0]
    assert sample_batch_size(spec, sample) == sample.args[0].shape[0]
    args, kwargs = make_batch(sample, spec, 7)
    assert args[0].shape == (7, 8) and kwargs == {}
    b = sample.args[0].shape[0]
    assert torch.equal(args[0][b], sample.args[0][0])
    args, _ = make_batch(sample, spec, 1)
    assert args[0].shape == (1, 8)


class TwoInputs(torch.nn.Module):
    def forward(self, x, mask=None, scale=1.0):
        return x * scale if mask is None else x * mask * scale


def test_make_batch_keeps_keywords_static_axes_and_constants():
    model = TwoInputs()
    recorder = GraphRecorder(model)
    for batch, seq in ((2, 5), (4, 7)):
        x, mask = torch.randn(batch, seq, 3), torch.ones(batch, seq, 3)
        recorder.record((x,), {"mask": mask, "scale": 2.0}, model(x, mask=mask, scale=2.0), batch_size=batch)
    spec = recorder.graph_specs[0]
    sample = recorder.samples(spec)[0]
    args, kwargs = make_batch(sample, spec, 8)
    bound = spec.bind(args, kwargs)
    seq = sample.args[0].shape[1]
    assert bound["x"].shape == (8, seq, 3) and bound["mask"].shape == (8, seq, 3) and bound["scale"] == 2.0
    assert model(*args, **kwargs).shape == (8, seq, 3)


def test_make_batch_without_batch_axis_fails():
    model = TinyMLP().eval()
    spec, data = record(model, batch_sizes=(3,))
    assert batch_range(spec) is None
    with pytest.raises(ValueError, match="no batch axis"):
        make_batch(data[0], spec, 4)


def test_compare_interleaves_rounds_and_measures_the_speedup():
    order = []

    def slow():
        order.append("slow")
        time.sleep(0.004)

    def fast():
        order.append("fast")
        time.sleep(0.001)

    result = profiling.compare([slow, fast], device="cpu", warmup=1, budget_s=0.05, min_rounds=4)
    assert result.rounds >= 4 and result.speedup(0) == 1.0
    assert 2.0 < result.speedup(1) < 6.0 and result.speedup(1, extra_ms=3.0) < 1.5
    assert result.latencies_ms[0] > result.latencies_ms[1] and result.baseline_ms == result.latencies_ms[0]
    timed = order[2 + 2:]  # after the warm-up call and the one sizing call of each
    switches = sum(1 for a, b in itertools.pairwise(timed) if a != b)
    assert switches >= result.rounds  # alternating rounds, not one block per function


def test_compare_stays_within_its_time_budget():
    start = time.perf_counter()
    result = profiling.compare([lambda: time.sleep(0.001)] * 2, device="cpu", warmup=0, budget_s=0.1, min_rounds=2)
    elapsed = time.perf_counter() - start
    assert result.rounds >= 2 and result.calls_per_round >= 1
    assert elapsed < 0.1 + 0.2  # one round over the budget at most (each round ~2 x 20 ms)
    with pytest.raises(ValueError):
        profiling.compare([])


def test_fresh_inputs_are_made_before_each_timed_call_and_not_timed(monkeypatch):
    """A call that changes its arguments is timed on new copies each time; making them is outside the timing."""
    monkeypatch.setattr(profiling.settings, "cpu_min_time_s", 0.0)
    made, seen = [], []

    def make():
        time.sleep(0.01)  # an expensive copy: must not show in the latencies
        made.append(1)
        return ([],), {}

    def step(cache):
        seen.append(len(cache))
        cache.append(1)  # what a decoder does to its KV cache

    fresh = profiling.FreshInputs(step, make)
    latencies = profiling.measure_all(fresh, device="cpu", warmup=1, iterations=4)
    assert seen == [0] * 5 and len(made) == 5  # each call on its own fresh cache, warm-up included
    assert max(latencies) < 5  # ms: the 10 ms copies were not timed
    comparison = profiling.compare([fresh, profiling.FreshInputs(step, make)], device="cpu", warmup=0, budget_s=0.0,
                                   min_rounds=1)
    assert set(seen) == {0} and max(max(r) for r in comparison.round_medians_ms) < 5


def test_only_the_calls_themselves_are_timed_sections():
    """A background job steps aside for requests except inside a timed call (`timed_section`): each call is its
    own section, so between calls - here, while the next inputs are made - the job may still step aside."""
    from aitune_core.timed_section import timing_now

    during_calls, between_calls = [], []

    def make():
        between_calls.append(timing_now())
        return (), {}

    def call():
        during_calls.append(timing_now())

    fresh = profiling.FreshInputs(call, make)
    profiling.measure_all(fresh, device="cpu", warmup=0, iterations=3, min_time_s=0.0)  # (warm-up: untimed)
    profiling.compare([fresh, profiling.FreshInputs(call, make)], device="cpu", warmup=1, budget_s=0.0, min_rounds=1)
    assert during_calls and all(during_calls)
    assert between_calls and not any(between_calls)
    assert not timing_now()
