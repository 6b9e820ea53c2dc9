import time
from typing import ClassVar

import pytest
import torch
from core_fakes import BuildFailsBackend, FakeConfig, GoodBackend, SlowBackend, TinyMLP, _ModuleBackend, record

from aitune_core.backends.backend import BackendState
from aitune_core.errors import NotFasterThanEagerError, TuningFailedError
from aitune_core.strategies.highest_throughput import HighestThroughputStrategy
from aitune_core.strategies.tune_job import TuneJob


class SleepyMLP(TinyMLP):
    """Each call costs a fixed 2 ms on top of the math: throughput grows with the batch size."""

    def __init__(self, fail_above: int | None = None):
        super().__init__()
        self.fail_above = fail_above
        self.batch_sizes = []

    def forward(self, x):
        self.batch_sizes.append(x.shape[0])
        if self.fail_above is not None and x.shape[0] > self.fail_above:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        time.sleep(0.002)
        return super().forward(x)


class FastBackend(_ModuleBackend):
    """Skips SleepyMLP's sleep: much faster than eager."""

    def _infer(self, x):
        return TinyMLP.forward(self.module, x)


class Tracked(SlowBackend):
    instances: ClassVar[list] = []

    def _build(self, module, graph_spec, data, cache_dir):
        Tracked.instances.append(self)
        super()._build(module, graph_spec, data, cache_dir)


def _strategy(backends, **kwargs):
    kwargs.setdefault("budget_s", 0.05)
    return HighestThroughputStrategy(backends, warmup=1, iterations=3, **kwargs)


def test_picks_the_faster_backend_and_releases_the_other(tmp_path):
    model = TinyMLP().eval()
    spec, data = record(model, batch_sizes=(2, 4))
    Tracked.instances.clear()
    report = _strategy([Tracked(), GoodBackend()]).tune_with_report(model, "mlp", spec, data, "cpu", tmp_path)
    assert isinstance(report.backend, GoodBackend) and report.backend.state is BackendState.ACTIVE
    slow, fast = report.candidates
    assert slow.throughput < fast.throughput and slow.latency_ms > 5
    assert Tracked.instances[0].state is BackendState.INACTIVE  # the loser was deactivated
    assert report.selected is fast and report.selected_latency_ms == fast.latency_ms

    report = _strategy([GoodBackend(), SlowBackend()]).tune_with_report(model, "mlp", spec, data, "cpu", tmp_path)
    assert isinstance(report.backend, GoodBackend)


def test_estimates_the_batch_size_with_the_original_module(tmp_path):
    model = SleepyMLP().eval()
    spec, data = record(model, batch_sizes=(2, 8))
    model.batch_sizes.clear()
    report = _strategy([GoodBackend()]).tune_with_report(model, "mlp", spec, data, "cpu", tmp_path)
    assert sorted(set(model.batch_sizes)) == [2, 4, 8]  # powers of two inside the recorded range
    assert report.batch_size == 8 and report.candidates[0].batch_size == 8
    assert report.eager_latency_ms is not None and report.speedup is not None

    capped = _strategy([GoodBackend()], max_batch_size=4).tune_with_report(model, "mlp", spec, data, "cpu", tmp_path)
    assert capped.batch_size == 4


def test_out_of_memory_ends_the_search(tmp_path):
    model = SleepyMLP().eval()
    spec, data = record(model, batch_sizes=(1, 16))
    model.fail_above = 4
    report = _strategy([FastBackend()]).tune_with_report(model, "mlp", spec, data, "cpu", tmp_path)
    assert report.batch_size == 4


def test_profiles_at_recorded_shapes_for_jit(tmp_path):
    model = SleepyMLP().eval()
    spec, data = record(model, batch_sizes=(2, 4, 4))
    model.batch_sizes.clear()
    strategy = _strategy([SlowBackend(FakeConfig(delay_s=0.02)), FastBackend()], profile_at_recorded_shapes=True)
    report = strategy.tune_with_report(model, "mlp", spec, data, "cpu", tmp_path)
    assert set(model.batch_sizes) <= {2, 4}  # only real recorded shapes were run
    assert report.batch_size == 4  # the most common recorded shape
    assert isinstance(report.backend, FastBackend)
    assert report.speedup > 1.5 and report.beats_eager()
    assert all(c.batch_size == 4 for c in report.candidates)


def test_graph_without_batch_axis_profiles_recorded_shapes(tmp_path):
    model = TinyMLP().eval()
    spec, data = record(model, batch_sizes=(3,))
    assert not spec.has_batch_axis()
    report = _strategy([GoodBackend()]).tune_with_report(model, "mlp", spec, data, "cpu", tmp_path)
    assert report.batch_size == 3 and report.eager_latency_ms is not None


def test_stop_when_speedup_over(tmp_path):
    model = SleepyMLP().eval()
    spec, data = record(model, batch_sizes=(2, 4))
    strategy = _strategy([FastBackend(), GoodBackend()], stop_when_speedup_over=2.0)
    report = strategy.tune_with_report(model, "mlp", spec, data, "cpu", tmp_path)
    assert len(report.candidates) == 1 and isinstance(report.backend, FastBackend)


def test_failures_are_skipped_and_all_failing_raises(tmp_path):
    model = TinyMLP().eval()
    spec, data = record(model, batch_sizes=(2, 4))
    report = _strategy([BuildFailsBackend(), GoodBackend()]).tune_with_report(model, "mlp", spec, data, "cpu", tmp_path)
    assert isinstance(report.backend, GoodBackend) and report.candidates[0].error
    with pytest.raises(TuningFailedError, match="compiler exploded"):
        _strategy([BuildFailsBackend()]).tune(model, "mlp", spec, data, "cpu", tmp_path)


def test_arguments_are_validated():
    with pytest.raises(ValueError):
        HighestThroughputStrategy(max_batch_size=0)
    with pytest.raises(ValueError):
        HighestThroughputStrategy(stop_when_speedup_over=0)
    with pytest.raises(ValueError, match="min_speedup"):
        HighestThroughputStrategy(min_speedup=-1)
    with pytest.raises(ValueError, match="budget_s"):
        HighestThroughputStrategy(budget_s="1")
    for field in ("min_gain", "min_speedup", "stop_when_speedup_over"):  # NaN compares false with everything
        with pytest.raises(ValueError, match=field):
            HighestThroughputStrategy(**{field: float("nan")})
    with pytest.raises(ValueError, match="at least one backend"):
        HighestThroughputStrategy([])
    assert HighestThroughputStrategy.measures_speed
    defaults = [b.describe() for b in HighestThroughputStrategy().backends]
    assert defaults == ["TorchInductorBackend()", "TorchEagerBackend()"]


def test_min_speedup_keeps_eager_when_no_candidate_wins_by_the_margin(tmp_path):
    model = SleepyMLP().eval()
    spec, data = record(model, batch_sizes=(2, 4))
    Tracked.instances.clear()
    strategy = _strategy([Tracked(FakeConfig(delay_s=0.0))], profile_at_recorded_shapes=True, min_speedup=1.5)
    with pytest.raises(NotFasterThanEagerError, match=r"at least 1\.5x faster") as caught:
        strategy.tune(model, "mlp", spec, data, "cpu", tmp_path)
    assert isinstance(caught.value, TuningFailedError)
    assert Tracked.instances[0].state is BackendState.INACTIVE  # the loser was released

    report = _strategy([FastBackend()], profile_at_recorded_shapes=True, min_speedup=1.5).tune_with_report(
        model, "mlp", spec, data, "cpu", tmp_path
    )
    assert isinstance(report.backend, FastBackend) and report.speedup > 1.5


def test_min_eager_latency_builds_nothing_for_cheap_modules(tmp_path):
    model = TinyMLP().eval()
    spec, data = record(model, batch_sizes=(2, 4))
    Tracked.instances.clear()
    strategy = _strategy([Tracked()], profile_at_recorded_shapes=True, min_eager_latency_us=1e6)
    with pytest.raises(NotFasterThanEagerError, match="too cheap to be worth a dispatch"):
        strategy.tune(model, "mlp", spec, data, "cpu", tmp_path)
    assert Tracked.instances == []  # decided before any build

    report = _strategy([GoodBackend()], profile_at_recorded_shapes=True, min_eager_latency_us=0).tune_with_report(
        model, "mlp", spec, data, "cpu", tmp_path
    )
    assert isinstance(report.backend, GoodBackend)


def test_dispatch_overhead_is_charged_to_every_candidate(tmp_path):
    model = SleepyMLP().eval()  # 2 ms per eager call; FastBackend skips the sleep
    spec, data = record(model, batch_sizes=(2, 4))
    strategy = _strategy([FastBackend()], profile_at_recorded_shapes=True, min_speedup=1.05,
                         dispatch_overhead_us=5000.0)  # a dispatch dearer than the sleep the backend saves
    with pytest.raises(NotFasterThanEagerError):
        strategy.tune(model, "mlp", spec, data, "cpu", tmp_path)
    report = _strategy([FastBackend()], profile_at_recorded_shapes=True, dispatch_overhead_us=100.0).tune_with_report(
        model, "mlp", spec, data, "cpu", tmp_path
    )
    assert report.selected_latency_ms >= 0.1  # the charge is part of the reported latency


def test_matching_a_call_to_its_graph_is_measured_and_charged_with_the_dispatch(tmp_path, monkeypatch):
    model = SleepyMLP().eval()  # 2 ms per eager call; FastBackend skips the sleep
    spec, data = record(model, batch_sizes=(2, 4))
    accepts = type(spec).accepts

    def slow_accepts(self, args, kwargs):  # a graph whose arguments take as long to match as the sleep saved
        time.sleep(0.003)
        return accepts(self, args, kwargs)

    monkeypatch.setattr(type(spec), "accepts", slow_accepts)
    with pytest.raises(NotFasterThanEagerError):
        _strategy([FastBackend()], profile_at_recorded_shapes=True, min_speedup=1.05,
                  dispatch_overhead_us=0.0).tune(model, "mlp", spec, data, "cpu", tmp_path)
    report = _strategy([FastBackend()], profile_at_recorded_shapes=True, min_speedup=1.05).tune_with_report(
        model, "mlp", spec, data, "cpu", tmp_path)  # no dispatch charged (AOT): matching is not measured either
    assert isinstance(report.backend, FastBackend)


def test_skip_single_layer_builds_nothing_for_one_torch_layer(tmp_path):
    layer = torch.nn.Linear(8, 8).eval()
    spec, data = record(layer, batch_sizes=(2, 4))
    Tracked.instances.clear()
    with pytest.raises(NotFasterThanEagerError, match=r"one torch\.nn layer \(Linear\)"):
        _strategy([Tracked()], skip_single_layer=True).tune(layer, "fc", spec, data, "cpu", tmp_path)
    assert Tracked.instances == []
    report = _strategy([GoodBackend()]).tune_with_report(layer, "fc", spec, data, "cpu", tmp_path)
    assert isinstance(report.backend, GoodBackend)  # off by default in the class


def test_skip_reason_is_cheap_and_says_why(tmp_path):
    layer = torch.nn.Linear(8, 8).eval()
    spec, data = record(layer, batch_sizes=(2, 4))
    assert "one torch.nn layer" in _strategy([GoodBackend()], skip_single_layer=True).skip_reason(
        TuneJob.of(layer, "fc", spec, data, "cpu", tmp_path)
    )
    model = TinyMLP().eval()
    spec, data = record(model, batch_sizes=(2, 4))
    assert "too cheap" in _strategy([GoodBackend()], min_eager_latency_us=1e6).skip_reason(
        TuneJob.of(model, "mlp", spec, data, "cpu", tmp_path)
    )
    assert _strategy([GoodBackend()], skip_single_layer=True, min_eager_latency_us=0).skip_reason(
        TuneJob.of(model, "mlp", spec, data, "cpu", tmp_path)
    ) is None


class Appends(torch.nn.Module):
    """A decoder step on a caller-owned list cache; remembers the cache length of every call it saw."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.lengths = []

    def forward(self, x, cache):
        self.lengths.append(len(cache))
        cache.append(self.fc(x))
        return torch.stack(cache).sum(0)


def test_a_stateful_graph_is_timed_on_fresh_copies_of_its_arguments(tmp_path):
    from aitune_core.recording.graph_recorder import GraphRecorder
    from aitune_core.recording.sample import owned_inputs

    model = Appends().eval()
    recorder = GraphRecorder(model)
    x, cache = torch.randn(2, 4), [torch.zeros(2, 4)]
    for _ in range(2):
        before = owned_inputs((x, cache), {})
        with torch.no_grad():
            out = model(x, cache)
        recorder.record(*before, out, after=((x, cache), {}))
    spec = recorder.graph_specs[-1]  # the cache held 2 entries before these calls
    data = recorder.samples(spec)
    model.lengths.clear()
    report = _strategy([GoodBackend()]).tune_with_report(model, "step", spec, data, "cpu", tmp_path)
    assert isinstance(report.backend, GoodBackend)
    assert model.lengths and set(model.lengths) == {2}  # every timed, warm-up and validation call: a fresh copy
    assert all(len(sample.args[1]) == 2 for sample in data)  # the recorded samples are as recorded
