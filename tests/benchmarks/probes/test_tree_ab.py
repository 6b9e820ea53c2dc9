"""benchmarks/probes/tree_ab.py: each process runs the tree it was given, and the ratio is this / base."""

from __future__ import annotations

import json
import shutil

import pytest

from benchmarks import common
from benchmarks.probes import tree_ab


@pytest.mark.slow
@pytest.mark.heavy  # (30 s on 2 cores: four serving processes; the driver's checks run in the tests below)
def test_two_trees_side_by_side_on_the_cpu(tmp_path):
    base = tmp_path / "base"
    shutil.copytree(common.REPO / "src", base / "src")  # a copy of this tree stands for the older one
    out = tmp_path / "ab.json"
    assert tree_ab.main(["--base", str(base), "--model", "tiny_resnet", "--batches", "2", "--device", "cpu",
                         "--rounds", "2", "--warmup", "4", "--iters", "5", "--profile-iters", "1",
                         "--out", str(out)]) == 0
    result = json.loads(out.read_text())["batches"]["2"]
    assert len(result["this_ms"]) == 2 and len(result["base_ms"]) == 2 and len(result["ratios"]) == 2
    assert result["median_ratio_this_over_base"] > 0
    assert len(result["profiles"]["this"]) == 2 and result["profiles"]["base"][0]["top_host_ops"]


def test_a_process_that_ran_another_tree_is_refused(tmp_path, monkeypatch):
    import subprocess

    def fake_run(command, **kwargs):
        out = command[command.index("--out-serve") + 1]
        with open(out, "w") as f:
            json.dump({"median_ms": 1.0, "aitune": "/somewhere/else/aitune/__init__.py"}, f)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(tree_ab.subprocess, "run", fake_run)
    args = tree_ab.argparse.Namespace(model="tiny_resnet", device="cpu", warmup=1, iters=1, profile_iters=0)
    (tmp_path / "base" / "src").mkdir(parents=True)
    with pytest.raises(RuntimeError, match="not from"):
        tree_ab._one(tmp_path / "base", args, 2, tmp_path)
