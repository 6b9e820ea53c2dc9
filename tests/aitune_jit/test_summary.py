"""summary: the exit summary names what was tuned, once per distinct line, with counts."""

from __future__ import annotations

import gc

import torch
from jit_helpers import CountingBackend, make_mlp, run

from aitune_jit import summary
from aitune_jit.config import jit_config
from aitune_jit.switch import enable


def _tune_fresh_models(count: int) -> None:
    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False
    jit_config.min_parameters = 0
    jit_config.min_samples = 2
    enable()
    for seed in range(count):
        torch.manual_seed(seed)
        model = make_mlp()
        run(model, [2, 3])
        del model
    gc.collect()


def test_many_models_of_one_kind_make_one_line_with_a_count() -> None:
    # a program that builds, tunes and drops 30 models got 30 identical lines at exit
    _tune_fresh_models(30)
    lines = summary.summary_lines()
    assert lines[0].startswith("aitune JIT tuning summary: 30 module(s) tuned")
    tuned = [line for line in lines if line.lstrip().startswith("🎯")]
    assert len(tuned) == 1 and tuned[0].endswith("(x30)")


def test_distinct_lines_are_capped(monkeypatch) -> None:
    monkeypatch.setattr(summary, "MAX_TUNED_LINES", 2)
    for index in range(4):
        summary._records[1000 + index] = summary.TunedRecord(f"Net{index}", "Net", 0, ["B"], None)
    lines = summary.summary_lines()
    assert sum(line.lstrip().startswith("🎯") for line in lines) == 2
    assert any("and 2 more tuned module(s)" in line for line in lines)


def test_a_forked_child_does_not_print_the_parents_summary_again(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "prefork.py"
    script.write_text(
        "import os, sys, torch\n"
        "import aitune.torch.jit.enable\n"
        "model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()\n"
        "with torch.no_grad():\n"
        "    model(torch.randn(2, 8))\n"
        "for _ in range(2):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        with torch.no_grad():\n"
        "            model(torch.randn(2, 8))\n"
        "        sys.exit(0)\n"
        "    os.waitpid(pid, 0)\n")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                            env={**__import__("os").environ, "AITUNE_JIT_CACHE_DIR": str(tmp_path / "c")})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stderr.count("JIT tuning summary") == 1, result.stderr


def test_a_long_reason_is_cut_on_one_line_and_a_short_one_kept_whole() -> None:
    long = "Graph break in user code\n" + "explanation " * 200
    text = summary.short_reason(long)
    assert "\n" not in text and len(text) < summary.REASON_CHARS + 80 and text.endswith("print_history())")
    assert summary.short_reason("it prints") == "it prints" and summary.short_reason(None) == ""
