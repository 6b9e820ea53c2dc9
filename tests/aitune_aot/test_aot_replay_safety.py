"""AOT recording: calls are recorded as the forward received them; a forward that changes its arguments is refused."""

from __future__ import annotations

import pytest
import torch

import aitune.torch as ait
from aitune_core.backends.torch_eager import TorchEagerBackend
from aitune_core.errors import NotReplayableError
from aitune_core.strategies.first_wins import FirstWinsStrategy


class Log:
    def __init__(self) -> None:
        self.entries: list[torch.Tensor] = []


class Appending(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, log: Log) -> torch.Tensor:
        log.entries.append(x)
        return self.fc(x) + len(log.entries)


class AddsKeys(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, features: dict[str, torch.Tensor]) -> torch.Tensor:
        out = self.fc(features["x"])
        features["seen"] = out
        return out


def test_a_forward_that_changes_its_arguments_is_refused_at_tune_and_never_replayed():
    module = ait.Module(Appending().eval(), "appending_aot")
    module.enable_recording()
    log = Log()
    with torch.no_grad():
        for _ in range(3):
            module(torch.randn(2, 8), log)
    with pytest.raises(NotReplayableError, match="changes its argument `log` \\(Log\\)"):
        module.tune(strategy=FirstWinsStrategy([TorchEagerBackend()]))
    assert len(log.entries) == 3  # tuning never called the forward with the caller's object


def test_a_forward_adding_keys_to_its_input_dict_is_not_recorded_with_the_added_keys():
    module = ait.Module(AddsKeys().eval(), "adds_keys_aot")
    module.enable_recording()
    with torch.no_grad():
        out = module({"x": torch.randn(2, 8)})
    assert out.shape == (2, 8)
    assert module.graph_specs == []  # not recorded: a replay would see the added key
    with pytest.raises(NotReplayableError, match="changes its argument `features` \\(dict\\)"):
        module.tune(strategy=FirstWinsStrategy([TorchEagerBackend()]))


def test_tune_does_not_say_a_module_whose_calls_changed_their_arguments_was_never_called(caplog):
    """It was called (generate() through it, eighth review): the reason it was not recorded is all it says."""
    module = ait.Module(Appending().eval(), "appending_through_tune")
    log = Log()
    with torch.no_grad():
        ait.tune(lambda x: module(x, log), [torch.randn(8) for _ in range(2)], batch_sizes=[2],
                 strategy=FirstWinsStrategy([TorchEagerBackend()]))
    assert "its calls cannot be replayed for tuning" in caplog.text
    assert "was not called by func" not in caplog.text
