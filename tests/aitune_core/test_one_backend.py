import pytest
from core_fakes import BuildFailsBackend, GoodBackend, TinyMLP, WrongValuesBackend, record

from aitune_core.errors import BackendBuildError, ValidationError
from aitune_core.strategies.one_backend import OneBackendStrategy


@pytest.fixture
def graph():
    model = TinyMLP().eval()
    spec, data = record(model)
    return model, spec, data


def test_returns_the_one_backend(graph, tmp_path):
    model, spec, data = graph
    report = OneBackendStrategy(backend=GoodBackend()).tune_with_report(model, "mlp", spec, data, "cpu", tmp_path)
    assert isinstance(report.backend, GoodBackend) and report.candidates[0].validated


def test_reraises_the_original_build_error(graph, tmp_path):
    model, spec, data = graph
    with pytest.raises(BackendBuildError, match="compiler exploded") as info:
        OneBackendStrategy(BuildFailsBackend()).tune(model, "mlp", spec, data, "cpu", tmp_path)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_reraises_the_validation_error(graph, tmp_path):
    model, spec, data = graph
    with pytest.raises(ValidationError, match="outside tolerance"):
        OneBackendStrategy(WrongValuesBackend()).tune(model, "mlp", spec, data, "cpu", tmp_path)


def test_default_backend_is_inductor():
    assert OneBackendStrategy().backend.describe() == "TorchInductorBackend()"
