import logging

import pytest
from core_fakes import BuildFailsBackend, GoodBackend, NaNBackend, TinyMLP, WrongValuesBackend, record

from aitune_core.backends.backend import BackendState
from aitune_core.errors import TuningFailedError
from aitune_core.strategies.first_wins import FirstWinsStrategy


@pytest.fixture
def graph():
    model = TinyMLP().eval()
    spec, data = record(model)
    return model, spec, data


def test_skips_failing_backends_and_ends_on_the_good_one(graph, tmp_path, caplog):
    model, spec, data = graph
    strategy = FirstWinsStrategy([BuildFailsBackend(), WrongValuesBackend(), GoodBackend(), NaNBackend()])
    with caplog.at_level(logging.INFO, logger="aitune"):
        report = strategy.tune_with_report(model, "mlp", spec, data, "cpu", tmp_path)
    assert isinstance(report.backend, GoodBackend) and report.backend.state is BackendState.ACTIVE
    descriptions = [c.description for c in report.candidates]
    assert descriptions == ["BuildFailsBackend()", "WrongValuesBackend()", "GoodBackend()"]
    failed_build, wrong, good = report.candidates
    assert not failed_build.built and "compiler exploded" in failed_build.error
    assert wrong.built and not wrong.validated and "ValidationError" in wrong.error
    assert good.succeeded and good.validated and good.duration_s >= 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and "compiler exploded" in warnings[0] and "outside tolerance" in warnings[1]
    assert report.eager_latency_ms is None and report.speedup is None


def test_nothing_works_lists_every_cause(graph, tmp_path):
    model, spec, data = graph
    strategy = FirstWinsStrategy([BuildFailsBackend(), NaNBackend()])
    with pytest.raises(TuningFailedError) as info:
        strategy.tune(model, "mlp", spec, data, "cpu", tmp_path)
    message = str(info.value)
    assert "module `mlp` (graph 0)" in message
    assert "BuildFailsBackend(): BackendBuildError" in message and "compiler exploded" in message
    assert "NaNBackend(): ValidationError" in message and "non-finite" in message
    assert len(info.value.candidates) == 2
