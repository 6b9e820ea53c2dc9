"""benchmarks/suite/workloads/serve.py: the plain workload script runs, writes its JSON and never imports aitune."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from benchmarks.common import REPO
from benchmarks.suite import models
from benchmarks.suite.workloads import serve

SERVE = REPO / "benchmarks" / "suite" / "workloads" / "serve.py"


def test_workload_script_runs_eager_and_writes_its_json(tmp_path):
    out, check = tmp_path / "r.json", tmp_path / "c.pt"
    cmd = [sys.executable, "-m", "benchmarks.suite.workloads.serve", "--model", "tiny_resnet", "--batch", "2",
           "--device", "cpu", "--warmup", "3", "--iters", "5", "--settle", "3", "--out", str(out),
           "--check-out", str(check), "--profile-calls", "3"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120, cwd=REPO)
    data = json.loads(out.read_text())
    assert data["module_call_patched"] is False
    assert data["serve"]["stats"]["n"] == 5
    assert data["weights_checksum"] == models.weights_checksum(models.build("tiny_resnet", 2).module)
    assert any("aten::" in line for line in data["profile_ops"])
    assert any("forward" in line for line in data["profile_python"])
    outputs = torch.load(check)
    assert len(outputs) == len(data["check_seeds"]) and outputs[0].shape == (2, 10)
    source = SERVE.read_text()
    assert "import aitune" not in source and "from aitune" not in source


def test_logger_levels_come_from_the_environment_spec():
    import logging

    serve.set_logger_levels("aitune_test_a=INFO, aitune_test_b=debug")
    assert logging.getLogger("aitune_test_a").level == logging.INFO
    assert logging.getLogger("aitune_test_b").level == logging.DEBUG
    serve.set_logger_levels("")  # nothing to do
    for bad in ("aitune", "aitune=LOUD", "=INFO"):
        with pytest.raises(SystemExit, match="SERVE_LOGGERS"):
            serve.set_logger_levels(bad)
