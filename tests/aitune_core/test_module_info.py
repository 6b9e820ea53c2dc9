"""module_device / count_parameters: the one copy every caller uses."""

from __future__ import annotations

import torch

from aitune_core.module_info import count_parameters, module_device
from aitune_core.recording.sample import Sample


class BuffersOnly(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.zeros(3, device="meta"))


def test_device_of_parameters_then_buffers_then_inputs_then_default():
    assert module_device(torch.nn.Linear(2, 2)) == torch.device("cpu")
    assert module_device(BuffersOnly()) == torch.device("meta")
    weightless = torch.nn.ReLU()
    assert module_device(weightless) is None
    assert module_device(weightless, default=torch.device("cpu")) == torch.device("cpu")
    sample = Sample.capture((torch.empty(2, device="meta"),), {})
    assert module_device(weightless, [sample]) == torch.device("meta")


def test_parameter_count_skips_lazy_parameters():
    assert count_parameters(torch.nn.Linear(3, 2)) == 8
    lazy = torch.nn.Sequential(torch.nn.LazyLinear(4), torch.nn.Linear(4, 1))
    assert count_parameters(lazy) == 5
    assert count_parameters(object()) == 0
