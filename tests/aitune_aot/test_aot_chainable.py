"""chainable: torch.nn.Module methods that return `self` return the AOT wrapper."""

from __future__ import annotations

import torch

import aitune.torch as ait
from aitune_aot.chainable import CHAINABLE


def test_chained_calls_keep_the_wrapper_and_act_on_the_module():
    wrapped = ait.Module(torch.nn.Linear(2, 2), "chainable_linear")
    assert wrapped.to(torch.float64).eval() is wrapped
    assert wrapped.weight.dtype == torch.float64 and not wrapped.training
    assert set(CHAINABLE) >= {"to", "eval", "train", "half", "cuda", "cpu"}
