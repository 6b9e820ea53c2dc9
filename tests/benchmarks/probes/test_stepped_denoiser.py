"""benchmarks/probes/stepped_denoiser.py: a contender's rounds and row, a failed contender is a row with the reason,
and jit-base needs the other tree."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from benchmarks.probes import stepped_denoiser as probe

pytest.importorskip("diffusers")


def _args(**overrides):
    values = {"device": "cpu", "rounds": 2, "steps": 3, "batch": 1, "until_s": 60.0, "base": None,
              "profile_rounds": 0}
    return argparse.Namespace(**{**values, **overrides})


def test_the_eager_contender_runs_its_rounds_and_compares_the_last_one_with_itself():
    row = probe.serve("eager", _args())
    assert row["contender"] == "eager" and row["rounds"] == 2 and row["first_round_s"] > 0
    assert row["max_rel_err_last_round"] == 0.0 and row["tuned_in_round"] is None
    assert row["profile"] is None  # no --profile-rounds


def test_profiled_rounds_follow_the_timed_ones():
    row = probe.serve("eager", _args(profile_rounds=1))
    assert row["rounds"] == 2 and row["profile"]["rounds"] == 1
    assert row["profile"]["top_host_ops"] and row["profile"]["wall_ms_per_round"] > 0


def test_a_contender_that_fails_or_prints_no_row_is_a_row_with_the_reason(monkeypatch, tmp_path):
    def fresh(command, **kwargs):
        assert kwargs["env"]["AUTOWRAPT_BOOTSTRAP"] == "aitune_enable_jit_tuning"
        assert kwargs["env"]["PYTHONPATH"].split(":")[0].endswith("base/src")  # the other tree's src first
        return subprocess.CompletedProcess(command, 1, stdout="", stderr="Traceback: no compiler")

    monkeypatch.setattr(subprocess, "run", fresh)
    row = probe._contender("jit-base", _args(base=str(tmp_path / "base")), str(tmp_path))
    assert row["contender"] == "jit-base" and "no compiler" in row["error"]


def test_jit_base_without_a_tree_is_refused(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["stepped_denoiser", "--contenders", "jit-base"])
    with pytest.raises(SystemExit):
        probe.main()


def test_the_result_names_the_aitune_variables_the_contenders_ran_under(monkeypatch, tmp_path):
    import json

    out = tmp_path / "result.json"
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "0")
    monkeypatch.setattr(probe, "_contender", lambda contender, args, folder: {"contender": contender, "rounds": 1})
    monkeypatch.setattr(sys, "argv", ["stepped_denoiser", "--contenders", "eager", "--out", str(out)])
    probe.main()
    document = json.loads(out.read_text())
    assert document["aitune_env"]["AITUNE_WORKER_YIELD_MS"] == "0" and document["rows"][0]["contender"] == "eager"


@pytest.mark.heavy
def test_the_jit_tunes_an_int_step_unet_loop_as_one_graph_with_two_compiles(tmp_path):
    """A real diffusers UNet called with Python int steps, blocking tuning: one graph (before free scalars: one per
    step), two dynamo compiles, the plain answers."""
    import json
    import os

    env = {**os.environ, "AUTOWRAPT_BOOTSTRAP": "aitune_enable_jit_tuning", "AITUNE_JIT_BLOCKING": "1",
           "AITUNE_JIT_CACHE_DIR": str(tmp_path / "cache"), "AITUNE_JIT_MIN_SPEEDUP": "1.0", "OMP_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-m", "benchmarks.probes.stepped_denoiser", "--serve", "jit", "--rounds",
                           "3", "--steps", "5", "--batch", "2"], cwd=probe.common.REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    rows = [line for line in done.stdout.splitlines() if line.startswith("ROW ")]
    assert done.returncode == 0 and rows, done.stderr[-3000:]
    row = json.loads(rows[-1][4:])
    assert row["state_at_end"] == "tuned" and row["graphs_recorded"] == 1 and row["dynamo_graphs"] == 2, row
    assert row["max_rel_err_last_round"] < 1e-4, row
