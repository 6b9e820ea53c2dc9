"""run_only / served: a compiled entry serves from its cached code and never compiles; a guard failure is answered
by the plain function and reported with that answer."""

from __future__ import annotations

import pytest
import torch
from core_fakes import TinyMLP
from torch._dynamo.utils import counters

from aitune_core.backends.isolated_entry import isolated_entry
from aitune_core.backends.run_only import run_only, served
from aitune_core.errors import CompiledCodeMissed


class _Scaled(torch.nn.Module):
    """A module whose plain attribute the trace reads (dynamo guards its value)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.mlp = TinyMLP()
        self.scale = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x) * self.scale


def test_a_guard_failure_is_answered_by_the_plain_function_without_a_compile():
    model = _Scaled().eval()
    entry = isolated_entry(model)
    compiled = torch.compile(entry, backend="eager", fullgraph=True)
    serving = run_only(entry)
    x = torch.randn(3, 8)
    with torch.no_grad():
        compiled(x)
        assert torch.equal(served(lambda: serving(x)), model(x))  # the compiled code's answer, no miss
        graphs = counters["stats"]["unique_graphs"]
        model.scale = 2.0
        with pytest.raises(CompiledCodeMissed) as missed:
            served(lambda: serving(x))
        assert torch.equal(missed.value.output, model(x))  # the plain function's answer, at the new scale
        assert counters["stats"]["unique_graphs"] == graphs  # nothing compiled
        model.scale = 1.0
        assert torch.equal(served(lambda: serving(x)), model(x))  # the cached code fits again


def test_without_dynamos_run_only_mode_there_is_no_serving_function(monkeypatch):
    monkeypatch.delattr(torch._dynamo, "run")
    assert run_only(isolated_entry(len)) is None


def test_a_plain_run_that_raises_hands_over_its_error_and_a_compiled_one_raises_as_is():
    model = _Scaled().eval()
    entry = isolated_entry(model)
    compiled = torch.compile(entry, backend="eager", fullgraph=True)
    serving = run_only(entry)
    x = torch.randn(3, 8)
    with torch.no_grad():
        compiled(x)
        model.scale = 2.0  # a miss: the plain forward runs, and fails on a bad input
        with pytest.raises(CompiledCodeMissed) as missed:
            served(lambda: serving(torch.randn(3, 5)))
        assert isinstance(missed.value.error, RuntimeError) and missed.value.output is None
    with pytest.raises(KeyError):  # not a plain run of the entry: raised as it is
        served(lambda: {}["x"])
