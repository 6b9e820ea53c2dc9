"""benchmarks/probes/cpu_steady_state.py: the plain side runs without aitune's hook; the table shows every row.

The workloads themselves tune with Inductor for tens of seconds each; the probe's own run (its result JSON under
benchmarks/results/) measures them, not this test.
"""

from __future__ import annotations

import torch

from aitune.torch.jit import disable, enable
from benchmarks.probes import cpu_steady_state


def test_the_plain_side_runs_with_torchs_own_call_and_the_hook_comes_back():
    original = torch.nn.Module.__call__
    enable()
    try:
        patched = torch.nn.Module.__call__
        assert patched is not original
        with cpu_steady_state._plain_torch(original):
            assert torch.nn.Module.__call__ is original
            torch.nn.Linear(2, 2)(torch.ones(1, 2))
        assert torch.nn.Module.__call__ is patched
    finally:
        disable()
    assert torch.nn.Module.__call__ is original


def test_the_table_shows_measured_and_failed_workloads(capsys):
    rows = [{"workload": "mlp", "speed_jit_over_plain": 1.012, "ratio_spread": [0.95, 1.08], "plain_step_ms": 1.2,
             "jit_step_ms": 1.19, "tuning_s": 20.0, "tuned": []},
            {"workload": "unet", "error": "boom"}]
    cpu_steady_state._table(rows)
    out = capsys.readouterr().out
    assert "1.012x" in out and "0.95..1.08" in out and "failed" in out
