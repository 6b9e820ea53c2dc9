"""The per-process tuning budget: once spent, modules not tuned yet stay eager (and say why)."""

from __future__ import annotations

import torch
from jit_helpers import CountingBackend, make_mlp

from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.state import NodeState
from aitune_jit.switch import enable
from aitune_jit.tuning_budget import TuningBudget, budget


def test_a_spent_budget_leaves_later_modules_eager():
    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False
    jit_config.min_parameters = 0
    jit_config.tuning_budget_s = 0.05
    CountingBackend.build_delay_s = 0.1  # the first tuning alone spends the budget
    budget.reset()
    try:
        enable()
        first, second = make_mlp(seed=0), make_mlp(seed=1)
        x = torch.randn(3, 32)
        with torch.no_grad():
            for _ in range(3):
                first(x)
            for _ in range(3):
                out = second(x)
        assert PatchedModule.of(first).state is NodeState.TUNED
        late = PatchedModule.of(second)
        assert late.state is NodeState.EAGER and "tuning budget of this process is spent" in late.reason
        assert CountingBackend.builds == 1
        torch.testing.assert_close(out, type(second).forward(second, x))
    finally:
        budget.reset()


def test_no_budget_means_no_limit():
    spent = TuningBudget()
    spent.charge(1e9)
    assert spent.exhausted() is None  # jit_config.tuning_budget_s is None by default
    jit_config.tuning_budget_s = 10
    assert "1000000000 s of jit_config.tuning_budget_s=10" in spent.exhausted()
