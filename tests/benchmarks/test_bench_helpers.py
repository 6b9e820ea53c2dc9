"""The benchmark suite's pure helpers: statistics, the time-to-steady rule, tables, the results schema."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import models
import report
import timing

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

# ----------------------------------------------------------------------------------------------- statistics


def test_summarize_median_percentiles():
    stats = timing.summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert stats.median_ms == 3.0
    assert stats.min_ms == 1.0
    assert stats.n == 5
    assert stats.p10_ms == pytest.approx(1.4)
    assert stats.p90_ms == pytest.approx(4.6)
    assert stats.mean_ms == pytest.approx(3.0)
    with pytest.raises(ValueError):
        timing.summarize([])


def test_throughput_is_samples_per_second():
    assert timing.throughput(32, 16.0) == pytest.approx(2000.0)


def test_compile_spike_sets_time_to_steady():
    # call 0 compiles (3 s), then 2 ms calls: steady from call 1, after the end of call 0
    warm = [3000.0] + [2.0] * 9
    assert timing.steady_index(warm, 2.0) == 1
    starts = [0.0, 3.0, *[3.0 + 0.002 * i for i in range(1, 9)]]
    ends = [3.0, *starts[2:], 3.02]
    assert timing.time_to_steady_s(starts, ends, warm, 2.0) == pytest.approx(3.0)


def test_sustained_slow_phase_counts_isolated_jitter_does_not():
    # eager phase at 4 ms, a tuning spike, tuned at 2 ms with one 3.5 ms blip (jitter) later on
    warm = [4.0] * 5 + [900.0] + [2.0] * 5 + [3.5] + [2.0] * 5
    assert timing.steady_index(warm, 2.0) == 6
    # without the spike, the sustained 4 ms phase still counts (two slow neighbours)
    assert timing.steady_index([4.0] * 5 + [2.0] * 5, 2.0) == 5
    # slow by ratio but under the 1 ms floor: sub-millisecond host noise
    assert timing.steady_index([0.5, 0.5, 0.2, 0.2], 0.2) == 0
    assert timing.steady_index([2.0] * 10, 2.0) == 0


def test_is_settled_ignores_isolated_blips():
    assert timing.is_settled([2.0] * 9 + [3.5] + [2.0] * 10, 20)
    assert not timing.is_settled([2.0] * 10 + [4.0, 4.0], 12)
    assert not timing.is_settled([2.0] * 3, 20)


def test_serve_loop_on_cpu_measures_a_slow_first_call():
    calls = []

    def fn(x):
        calls.append(x)
        if len(calls) == 1:
            time.sleep(0.3)  # a "compile" on the first call
        return x * 2

    result = timing.serve_loop(fn, [1, 2], "cpu", warmup=5, iters=10, settle=5, max_warmup_s=10)
    assert len(result.timed_ms) == 10
    assert len(calls) == len(result.warmup_ms) + 10
    assert calls[:4] == [1, 2, 1, 2]  # inputs rotate
    assert result.first_call_s >= 0.3
    assert result.time_to_steady_s == pytest.approx(result.first_call_s, rel=0.05)
    assert result.settled
    d = result.to_dict()
    assert d["stats"]["n"] == 10 and len(d["timed_ms"]) == 10


def test_relative_error():
    ref = torch.tensor([3.0, 4.0])
    rel, max_abs = timing.relative_error(torch.tensor([3.0, 4.5]), ref)
    assert rel == pytest.approx(0.1)
    assert max_abs == pytest.approx(0.5)
    assert timing.relative_error(torch.tensor([float("nan"), 4.0]), ref) == (math.inf, math.inf)
    with pytest.raises(ValueError):
        timing.relative_error(torch.zeros(3), ref)


# ------------------------------------------------------------------------------------------------ models


@pytest.mark.parametrize("name", ["tiny_resnet", "tiny_vit"])
def test_tiny_models_are_deterministic_and_fed_real_data(name):
    a, b = models.build(name, 2), models.build(name, 2)
    assert models.weights_checksum(a.module) == models.weights_checksum(b.module)
    x = a.make_inputs(0)
    assert torch.equal(x.args[0], b.make_inputs(0).args[0])
    assert not torch.equal(x.args[0], a.make_inputs(1).args[0])
    assert x.args[0].abs().sum() > 0
    with torch.no_grad():
        out = models.primary_output(a.module(*x.args, **x.kwargs))
    assert out.shape == (2, 10)


def test_primary_output_picks_first_tensor():
    t = torch.ones(1)
    assert models.primary_output(t) is t
    assert models.primary_output((None, t)) is t
    assert models.primary_output({"last_hidden_state": t, "pooler": torch.zeros(1)}) is t
    with pytest.raises(TypeError):
        models.primary_output("text")


def test_unknown_model_is_an_error():
    with pytest.raises(ValueError, match="unknown model"):
        models.build("nope", 1)


# ------------------------------------------------------------------------------------------ table + schema


def _row(contender, median, **extra):
    row = {"model": "m", "model_source": "src", "batch": 8, "precision": "fp32", "contender": contender,
           "status": "ok", "reason": None, "median_ms": median, "p10_ms": median * 0.9, "p90_ms": median * 1.1,
           "throughput": 8000.0 / median, "first_call_s": 0.1, "time_to_steady_s": 0.1, "rel_err": 1e-6}
    row.update(extra)
    return row


def _doc(rows, date="2026-11-21T10:00:00+00:00", device="NVIDIA H100"):
    return {"schema": "aitune-bench/1", "suite": "gpu", "date": date, "device": {"name": device, "type": "cuda"},
            "torch": "2.11.0", "settings": {"precision": "fp32"}, "results": rows}


def test_derive_speedups_against_eager_and_best_compile():
    rows = report.derive([
        _row("aitune-jit", 4.0),
        _row("compile:default", 8.0),
        _row("eager", 10.0),
        _row("compile:max-autotune-no-cudagraphs", 5.0),
        {"model": "m", "batch": 8, "precision": "fp32", "contender": "aitune-aot", "status": "failed",
         "reason": "boom"},
    ])
    by = {r["contender"]: r for r in rows}
    assert [r["contender"] for r in rows] == ["eager", "aitune-jit", "compile:default",
                                              "compile:max-autotune-no-cudagraphs", "aitune-aot"]
    assert by["aitune-jit"]["speedup_vs_eager"] == pytest.approx(2.5)
    assert by["aitune-jit"]["speedup_vs_best_compile"] == pytest.approx(1.25)
    assert by["aitune-jit"]["best_compile"] == "compile:max-autotune-no-cudagraphs"
    assert by["eager"]["speedup_vs_eager"] == pytest.approx(1.0)
    assert by["aitune-aot"]["speedup_vs_eager"] is None


def test_format_table_has_one_line_per_row_and_reasons():
    rows = report.derive([_row("eager", 10.0), {"model": "m", "batch": 8, "precision": "fp32",
                                                 "contender": "aitune-jit", "status": "not available",
                                                 "reason": "aitune is not installed"}])
    table = report.format_table(rows).splitlines()
    assert table[0] == report.TABLE_HEADER
    assert len(table) == 4
    assert table[0].count("|") == table[1].count("|") == table[2].count("|") == table[3].count("|")
    assert "not available: aitune is not installed" in table[3]
    assert "| 10.00 |" in table[2] and "| 800.0 |" in table[2]


def test_validate_results_schema():
    assert report.validate(_doc([_row("eager", 1.0)])) == []
    bad = _doc([{"model": "m", "batch": 1, "precision": "fp32", "contender": "eager", "status": "ok"},
                {"model": "m", "batch": 1, "precision": "fp32", "contender": "x", "status": "skipped"}])
    del bad["torch"]
    problems = report.validate(bad)
    assert "missing key 'torch'" in problems
    assert any("missing 'median_ms'" in p for p in problems)
    assert any("missing 'reason'" in p for p in problems)


def test_sections_merge_parts_newest_wins_and_doc_markers(tmp_path):
    part1 = _doc([_row("eager", 10.0), _row("aitune-jit", 5.0)], date="2026-11-21T10:00:00+00:00")
    part2 = _doc([{**_row("eager", 20.0), "model": "n"}], date="2026-11-21T11:00:00+00:00")
    rerun = _doc([_row("aitune-jit", 4.0)], date="2026-11-21T12:00:00+00:00")
    files = []
    for i, doc in enumerate([rerun, part1, part2]):
        path = tmp_path / f"r{i}.json"
        path.write_text(json.dumps(doc))
        files.append(path)
    secs = report.sections(report.load(files))
    assert len(secs) == 1
    rows = {(r["model"], r["contender"]): r for r in secs[0]["rows"]}
    assert rows[("m", "aitune-jit")]["median_ms"] == 4.0
    assert rows[("n", "eager")]["median_ms"] == 20.0

    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# Benchmarks\n\nmethod text\n\n{report.BEGIN}\nold\n{report.END}\n\ntrailer\n")
    report.update_doc(doc, report.render_sections(secs))
    text = doc.read_text()
    assert "method text" in text and "trailer" in text and "old" not in text
    assert "geometric mean 2.50× eager" in text
    report.update_doc(doc, "second")
    assert doc.read_text().count(report.BEGIN) == 1


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    secs = report.sections([{**_doc([_row("eager", 10.0), _row("aitune-jit", 5.0)]), "_file": "x.json"}])
    png = tmp_path / "chart.png"
    assert report.plot(secs, png)
    assert png.read_bytes()[:4] == b"\x89PNG"


# ------------------------------------------------------------------------------------------------ workload


def test_workload_script_runs_eager_and_writes_its_json(tmp_path):
    out, check = tmp_path / "r.json", tmp_path / "c.pt"
    cmd = [sys.executable, str(BENCHMARKS / "workloads" / "serve.py"), "--model", "tiny_resnet", "--batch", "2",
           "--device", "cpu", "--warmup", "3", "--iters", "5", "--settle", "3", "--out", str(out),
           "--check-out", str(check)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    data = json.loads(out.read_text())
    assert data["module_call_patched"] is False
    assert data["serve"]["stats"]["n"] == 5
    assert data["weights_checksum"] == models.weights_checksum(models.build("tiny_resnet", 2).module)
    outputs = torch.load(check)
    assert len(outputs) == len(data["check_seeds"]) and outputs[0].shape == (2, 10)
    source = (BENCHMARKS / "workloads" / "serve.py").read_text()
    assert "import aitune" not in source and "from aitune" not in source
