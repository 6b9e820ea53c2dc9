"""benchmarks/probes/precompiled_load.py: a row says whether the file was made and loaded, with the reason when
not; the real make and load (one Inductor compile per model) is heavy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.probes import precompiled_load as probe

CPU = torch.device("cpu")


def test_a_make_that_fails_is_a_row_with_the_reason(monkeypatch, tmp_path):
    def fail(*args, **kwargs):
        raise RuntimeError("no toolchain")

    monkeypatch.setattr("aitune_core.precompiling.make_precompiled", fail)
    row = probe.row("bert", CPU, False, tmp_path)
    assert row == {"model": "bert", "made": False, "error": "RuntimeError: no toolchain"}


def test_the_fresh_process_s_answer_is_the_row_and_its_silence_an_error(monkeypatch, tmp_path):
    monkeypatch.setattr("aitune_core.precompiling.make_precompiled", lambda *args, **kwargs: "d1g")
    commands = []

    def fresh(command, **kwargs):
        commands.append(command)
        out = 'LOAD {"loaded": true, "load_s": 1.0, "max_abs_err": 1e-07}\n' if len(commands) == 1 else ""
        return subprocess.CompletedProcess(command, 0, stdout=out, stderr="Traceback: boom")

    monkeypatch.setattr(subprocess, "run", fresh)
    loaded = probe.row("gpt2", CPU, True, tmp_path)
    assert loaded["loaded"] and loaded["max_abs_err"] == 1e-07 and loaded["made"]
    assert commands[0][-4:] == ["d1g", "--device", "cpu", "--keep-defaults-guards"]
    silent = probe.row("gpt2", CPU, False, tmp_path)
    assert silent["loaded"] is False and "boom" in silent["error"]


@pytest.mark.heavy
def test_a_tiny_bert_s_file_loads_in_a_fresh_process_and_answers_as_eager(tmp_path):
    out = tmp_path / "result.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.probes.precompiled_load", "--models", "bert", "--out",
                           str(out)], cwd=Path(probe.common.REPO), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    row = json.loads(out.read_text())["rows"][0]
    assert row["made"] and row["loaded"] and row["max_abs_err"] < 1e-4, row
