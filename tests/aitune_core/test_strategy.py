import logging

import pytest
import torch
from core_fakes import FakeConfig, GoodBackend, TinyMLP, WrongValuesBackend, record

from aitune_core.backends.backend import BackendState
from aitune_core.errors import TuningFailedError
from aitune_core.strategies.first_wins import FirstWinsStrategy
from aitune_core.strategies.strategy import CandidateReport, TuneReport, TuneStrategy
from aitune_core.strategies.tune_job import TuneJob


@pytest.fixture
def graph():
    model = TinyMLP().eval()
    spec, data = record(model)
    return model, spec, data


def _args(graph, tmp_path):
    model, spec, data = graph
    return model, "mlp", spec, data, "cpu", tmp_path


def test_tune_report_speedup():
    backend = GoodBackend()
    report = TuneReport(backend=backend, eager_latency_ms=4.0, selected_latency_ms=2.0)
    assert report.speedup == 2.0 and report.beats_eager() and not report.beats_eager(3.0)
    assert TuneReport(backend=backend).speedup is None
    assert TuneReport(backend=backend).beats_eager() is None
    assert CandidateReport("x", "k", built=True).succeeded
    assert not CandidateReport("x", "k", built=True, error="boom").succeeded


def test_strategy_needs_init_backends(graph, tmp_path):
    model, spec, data = graph
    built = GoodBackend().build(model, spec, data, torch.device("cpu"), tmp_path)
    with pytest.raises(ValueError, match="ACTIVE"):
        FirstWinsStrategy([built])
    with pytest.raises(TypeError):
        FirstWinsStrategy(["TorchInductorBackend"])  # type: ignore[list-item]
    assert [b.describe() for b in FirstWinsStrategy().backends] == ["TorchInductorBackend()"]


def test_blueprints_are_never_built(graph, tmp_path):
    blueprint = GoodBackend()
    strategy = FirstWinsStrategy([blueprint])
    first = strategy.tune(*_args(graph, tmp_path))
    second = strategy.tune(*_args(graph, tmp_path))
    assert blueprint.state is BackendState.INIT
    assert first is not blueprint and second is not first and first.state is BackendState.ACTIVE


def test_log_layout(graph, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="aitune"):
        FirstWinsStrategy([GoodBackend(FakeConfig(tag="a"))]).tune(*_args(graph, tmp_path))
    text = "\n".join(r.getMessage() for r in caplog.records)
    expected_in_order = [
        "🚀 Tuning graph `0` for module `mlp`:",
        "number of parameters: 212",
        "precisions: torch.float32",
        "graph_spec:",
        "input_spec:",
        "['batch0', 8]",
        "output_spec:",
        "num samples: 2",
        "device: cpu",
        f"cache_dir: {tmp_path}",
        "strategy:",
        "name: First Wins Strategy",
        "description: try backends in order",
        "backends:",
        "GoodBackend(tag='a')",
        "⏳ Executing strategy `FirstWinsStrategy` on module `mlp` (graph: 0)",
        "🤖 backend: GoodBackend(tag='a')",
        "🔄 in progress...please wait",
        "✅ backend built",
        "✅ backend validated",
        "⏱️ completed in",
        "🎯 Strategy FirstWinsStrategy execution finished:",
        "✅ Selected GoodBackend(tag='a') for module mlp and graph spec Name=0",
        "⏱️ Tune `FirstWinsStrategy`: completed in",
    ]
    position = 0
    for piece in expected_in_order:
        found = text.find(piece, position)
        assert found >= 0, f"{piece!r} missing (or out of order) in:\n{text}"
        position = found + len(piece)
    assert "\x1b[" not in text  # no terminal control codes in logs


def test_correctness_check_can_be_disabled(graph, tmp_path):
    strategy = FirstWinsStrategy([WrongValuesBackend()])
    with pytest.raises(TuningFailedError):
        strategy.tune(*_args(graph, tmp_path))
    strategy.enable_correctness_check(False)
    report = strategy.tune_with_report(*_args(graph, tmp_path))
    assert isinstance(report.backend, WrongValuesBackend)
    assert report.candidates[0].built and not report.candidates[0].validated


def test_dry_run_builds_nothing(graph, tmp_path, caplog):
    blueprint = GoodBackend()
    with caplog.at_level(logging.INFO, logger="aitune"):
        FirstWinsStrategy([blueprint]).tune_dry_run(*_args(graph, tmp_path))
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "🚀 Tuning graph `0`" in text and "Dry run" in text and "✅ backend built" not in text
    assert blueprint.state is BackendState.INIT


class CustomStrategy(TuneStrategy):
    """A user strategy whose `_tune` returns just a `Backend`, as the public API allows."""

    def __init__(self):
        super().__init__([GoodBackend()])
        self.calls = []

    def _pre_tune(self, *args):
        self.calls.append("pre")

    def _tune(self, module, name, graph_spec, data, device, cache_dir):
        self.calls.append("tune")
        return self.backends[0].blueprint_copy().build(module, graph_spec, data, device, cache_dir)

    def _post_tune(self, *args):
        self.calls.append("post")


def test_custom_strategy_returning_a_backend(graph, tmp_path):
    strategy = CustomStrategy()
    report = strategy.tune_with_report(*_args(graph, tmp_path))
    assert strategy.calls == ["pre", "tune", "post"]
    assert isinstance(report.backend, GoodBackend) and report.candidates == [] and report.strategy == "CustomStrategy"


def test_no_samples_is_an_error(graph, tmp_path):
    model, spec, _ = graph
    with pytest.raises(TuningFailedError, match="No samples"):
        FirstWinsStrategy([GoodBackend()]).tune(model, "mlp", spec, [], "cpu", tmp_path)


class _UncopyableBackend(GoodBackend):
    def __deepcopy__(self, memo):
        raise TypeError("cannot pickle '_thread.lock' object")


class _NamelessBackend(GoodBackend):
    def describe(self):
        raise RuntimeError("describe() is broken")


def test_every_per_candidate_step_is_a_candidate_failure(graph, tmp_path):
    """A blueprint that cannot be copied, or whose describe() raises, fails as a candidate; the next one wins."""
    strategy = FirstWinsStrategy([_UncopyableBackend(), _NamelessBackend(), GoodBackend()])
    report = strategy.tune_with_report(*_args(graph, tmp_path))
    first, second, third = report.candidates
    assert "TypeError: cannot pickle" in first.error and not first.built
    assert second.description == "_NamelessBackend" and "describe() is broken" in second.error
    assert third.succeeded and report.selected_index == 2


def test_a_failing_on_success_step_discards_the_candidate(graph, tmp_path):
    strategy = FirstWinsStrategy([GoodBackend()])
    built = []

    def on_success(report, backend):
        built.append(backend)
        raise RuntimeError("bookkeeping failed")

    model, _name, spec, data, _device, _cache = _args(graph, tmp_path)
    job = TuneJob.of(model, "mlp", spec, data, "cpu", tmp_path)
    report, backend = strategy._try_backend(GoodBackend(), job, on_success=on_success)
    assert backend is None and "bookkeeping failed" in report.error
    assert built and built[0].state is not BackendState.ACTIVE  # released


def test_a_candidate_rejected_for_its_values_reports_how_close_it_was(graph, tmp_path):
    report = FirstWinsStrategy([WrongValuesBackend(), GoodBackend()]).tune_with_report(*_args(graph, tmp_path))
    wrong, good = report.candidates
    assert wrong.error.startswith("ValidationError: WrongValuesBackend() (graph 0, sample 0): output differs")
    assert wrong.closeness.startswith("WrongValuesBackend() (graph 0, sample 0): output: rel L2 error ")
    assert "8/8 elements outside rtol=0.001, atol=0.0001 (allowed 0); max abs error 1 (cap " in wrong.closeness
    assert good.closeness is None and good.error is None
    with pytest.raises(TuningFailedError) as info:
        FirstWinsStrategy([WrongValuesBackend()]).tune(*_args(graph, tmp_path))
    assert f"  - WrongValuesBackend(): ValidationError: values not close enough: {wrong.closeness}" in str(info.value)


class _WrapsFirstWins(FirstWinsStrategy):
    """A user's subclass of a built-in strategy that overrides the documented `_tune` and calls the built-in."""

    def __init__(self):
        super().__init__([GoodBackend()])
        self.seen = []

    def _tune(self, module, name, graph_spec, data, device, cache_dir):
        self.seen.append((name, len(data), device))
        return super()._tune(module, name, graph_spec, data, device, cache_dir)


def test_a_subclass_of_a_built_in_strategy_may_override_tune_and_call_super(graph, tmp_path):
    strategy = _WrapsFirstWins()
    report = strategy.run(TuneJob.of(*_args(graph, tmp_path)))
    assert strategy.seen == [("mlp", len(graph[2]), torch.device("cpu"))]
    assert isinstance(report.backend, GoodBackend) and report.backend.state is BackendState.ACTIVE


def test_a_strategy_without_tune_cannot_be_made():
    class Nothing(TuneStrategy):
        pass

    with pytest.raises(TypeError, match="implements _tune"):
        Nothing([GoodBackend()])

