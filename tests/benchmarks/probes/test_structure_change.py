"""benchmarks/probes/structure_change.py: a contender's row from its latencies, a failed contender is a row with
the reason; the real run (two fresh processes, one JIT tuning twice) is heavy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.probes import structure_change as probe


def test_a_row_names_the_first_and_slowest_request_after_the_change_and_the_steady_median():
    row = probe.summarize([2.0, 1.0, 1.0], [900.0, 3.0, 2.0, 1.0, 1.0, 1.0], [0.0, 1e-3], 4.567)
    assert row == {"before_p50_ms": 1.0, "first_after_ms": 900.0, "max_after_ms": 900.0, "steady_after_p50_ms": 1.0,
                   "requests_after": 6, "retuned_after_s": 4.57, "max_abs_err_after": 1e-3}
    assert probe.summarize([], [], [], None)["first_after_ms"] is None


def probe_args():
    import argparse

    return argparse.Namespace(device="cpu", change="dtype", dtype="float64", interval_ms=20.0, after_s=1.0,
                              tuned_timeout_s=1.0, cache_dir="/nonexistent")


def test_a_contender_that_fails_or_prints_no_row_is_a_row_with_the_reason(monkeypatch):
    def fresh(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, stdout="", stderr="Traceback: no compiler")

    monkeypatch.setattr(subprocess, "run", fresh)
    args = probe_args()
    row = probe._contender("compile", args)
    assert row["contender"] == "compile" and "no compiler" in row["error"]


@pytest.mark.heavy
def test_after_a_cast_the_jit_answers_at_once_and_right_and_is_tuned_again(tmp_path):
    out = tmp_path / "result.json"
    # (on a busy 2-core CPU a compiled BERT may miss the default 1.05x: 1.0x is enough to be tuned here)
    env = {**os.environ, "AITUNE_JIT_MIN_SPEEDUP": "1.0", "OMP_NUM_THREADS": "2"}  # (tuned_before_cast needs it)
    done = subprocess.run([sys.executable, "-m", "benchmarks.probes.structure_change", "--contenders", "jit",
                           "--dtype", "float64", "--after-s", "40", "--out", str(out)],
                          cwd=Path(probe.common.REPO), capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads(out.read_text())["rows"][0]
    assert row["tuned_before_cast"] and row["max_abs_err_after"] < 1e-4, row
    # no compile inside the first request after the cast (an Inductor recompile of this BERT takes seconds here);
    # the cast model was tuned again, or stayed eager because its compiled float64 graph was not faster
    assert row["first_after_ms"] < 1000, row
    assert row["retuned_after_s"] is not None or row["state_at_end"] == "eager", row


def test_the_changes_are_a_cast_and_a_config_flag():
    model = torch.nn.Linear(2, 2)
    probe.change(model, "dtype", torch.float64)
    assert model.weight.dtype is torch.float64
    model.config = type("Config", (), {"output_hidden_states": False})()
    probe.change(model, "config", torch.float64)
    assert model.config.output_hidden_states is True
