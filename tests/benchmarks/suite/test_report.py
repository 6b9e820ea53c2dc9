"""benchmarks/suite/report.py: speedups, the markdown table, the results schema, merging and the chart."""

from __future__ import annotations

import json

import pytest

from benchmarks.suite import report


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


def test_jit_time_to_tuned_is_compared_with_the_workload_compile_first_call():
    rows = report.derive([
        _row("eager", 10.0),
        _row("aitune-jit", 4.0, time_to_steady_s=12.0),
        _row(report.WORKLOAD_COMPILE, 4.1, first_call_s=8.0),
        _row("compile:default", 4.2, first_call_s=5.0),  # warm, in-process: not the comparator
    ])
    by = {r["contender"]: r for r in rows}
    assert by["aitune-jit"]["tuned_vs_compile_first_call"] == pytest.approx(1.5)
    assert by["compile:default"]["tuned_vs_compile_first_call"] is None
    assert by[report.WORKLOAD_COMPILE]["speedup_vs_best_compile"] == pytest.approx(1.0)  # a torch.compile mode
    assert "time-to-tuned 1.50x the first answer of compile:default (workload)" in report.format_table(rows)
    assert "time-to-tuned at most 1.50x" in report._summary(rows)[0]


def test_the_compile_reference_counts_its_torch_compile_line():
    """The `torch.compile()` line imports Inductor: a script pays it before its first answer, as the JIT pays the
    same import on its worker."""
    rows = report.derive([
        _row("eager", 10.0),
        _row("aitune-jit", 4.0, time_to_steady_s=12.0),
        _row(report.WORKLOAD_COMPILE, 4.1, first_call_s=6.0, compile_call_s=2.0),
    ])
    by = {r["contender"]: r for r in rows}
    assert by["aitune-jit"]["tuned_vs_compile_first_call"] == pytest.approx(1.5)


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


def test_sections_take_a_case_from_its_most_complete_run():
    full = _doc([_row("eager", 10.0), _row("aitune-jit", 5.0), _row("compile:reduce-overhead", 5.2),
                 _row("compile:default", 6.0),
                 {"model": "m", "batch": 8, "precision": "fp32", "contender": "compile:max-autotune-no-cudagraphs",
                  "status": "skipped", "reason": "time budget"}], date="2026-11-21T10:00:00+00:00")
    # a later run made to add max-autotune: its own eager, JIT and reduce-overhead rows do not replace the
    # fuller run's, only the contender that run lacks (skipped there) comes from it
    extra = _doc([_row("eager", 11.0), _row("aitune-jit", 6.0), _row("compile:max-autotune-no-cudagraphs", 5.5)],
                 date="2026-11-21T11:00:00+00:00")
    rows = {r["contender"]: r for r in report.sections([full, extra])[0]["rows"]}
    assert [rows[c]["run"] for c in ("eager", "aitune-jit", "compile:reduce-overhead")] == [1, 1, 1]
    assert rows["aitune-jit"]["median_ms"] == 5.0
    ma = rows["compile:max-autotune-no-cudagraphs"]
    assert (ma["run"], ma["status"], ma["median_ms"]) == (2, "ok", 5.5)
    assert ma["speedup_vs_eager"] == pytest.approx(2.0)  # against its own run's eager (11 ms)


def test_a_run_with_long_timing_windows_outranks_fuller_short_ones():
    full = _doc([_row("eager", 10.0), _row("aitune-jit", 5.0), _row("compile:reduce-overhead", 4.0),
                 _row("compile:default", 6.0)], date="2026-11-21T10:00:00+00:00")
    long = _doc([_row("eager", 10.0), _row("aitune-jit", 4.1), _row("compile:reduce-overhead", 4.0)],
                date="2026-11-21T09:00:00+00:00")
    long["settings"]["min_timed_s"] = 2.0
    rows = {r["contender"]: r for r in report.sections([full, long])[0]["rows"]}
    assert rows["aitune-jit"]["median_ms"] == 4.1 and rows["aitune-jit"]["run"] == 1  # the long run (older)
    assert rows["compile:default"]["run"] == 2  # only what the long run lacks comes from the other


def test_sections_merge_parts_newest_wins_and_doc_markers(tmp_path):
    part1 = _doc([_row("eager", 10.0), _row("aitune-jit", 5.0)], date="2026-11-21T10:00:00+00:00")
    part2 = _doc([{**_row("eager", 20.0), "model": "n"}], date="2026-11-21T11:00:00+00:00")
    rerun = _doc([_row("eager", 8.0), _row("aitune-jit", 4.0)], date="2026-11-21T12:00:00+00:00")
    jit_only = _doc([{**_row("aitune-jit", 1.0), "model": "n"}], date="2026-11-21T13:00:00+00:00")
    files = []
    for i, doc in enumerate([rerun, part1, part2, jit_only]):
        path = tmp_path / f"r{i}.json"
        path.write_text(json.dumps(doc))
        files.append(path)
    secs = report.sections(report.load(files))
    assert len(secs) == 1
    rows = {(r["model"], r["contender"]): r for r in secs[0]["rows"]}
    assert rows[("m", "aitune-jit")]["median_ms"] == 4.0
    assert rows[("n", "eager")]["median_ms"] == 20.0
    # ratios come from one run: the rerun's own eager (8 ms), never the older run's (10 ms) ...
    assert rows[("m", "aitune-jit")]["speedup_vs_eager"] == 2.0
    assert (rows[("m", "aitune-jit")]["run"], rows[("m", "eager")]["run"]) == (3, 3)
    # ... and a run without eager gives no ratio instead of one against another run's eager
    assert rows[("n", "aitune-jit")]["speedup_vs_eager"] is None

    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# Benchmarks\n\nmethod text\n\n{report.BEGIN}\nold\n{report.END}\n\ntrailer\n")
    report.update_doc(doc, report.render_sections(secs))
    text = doc.read_text()
    assert "method text" in text and "trailer" in text and "old" not in text
    assert "geometric mean 2.00× eager over 1 cases" in text
    assert "run 3 `r0.json`" in text
    report.update_doc(doc, "second")
    assert doc.read_text().count(report.BEGIN) == 1


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    secs = report.sections([{**_doc([_row("eager", 10.0), _row("aitune-jit", 5.0)]), "_file": "x.json"}])
    png = tmp_path / "chart.png"
    assert report.plot(secs, png)
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_other_benchmarks_json_is_not_a_suite_result(tmp_path):
    other = tmp_path / "hook_overhead.json"
    other.write_text(json.dumps({"benchmark": "hook_overhead", "results": []}))
    ours = tmp_path / "gpu.json"
    ours.write_text(json.dumps(_doc([_row("eager", 1.0)])))
    (tmp_path / "broken.json").write_text("{")
    assert [p.name for p in sorted(tmp_path.glob("*.json")) if report.is_suite_result(p)] == ["gpu.json"]
