"""benchmarks/probes/background_tuning_report.py: what counts as during/after tuning, time-to-tuned on both clocks,
the acceptance ratios."""

from __future__ import annotations

import torch

from benchmarks.probes import background_tuning as bench
from benchmarks.probes import background_tuning_report as report


def _row(t: float, latency: float, tuned: bool) -> dict:
    return {"t": t, "latency_s": latency, "batch": 1, "seq": 128, "tuned": tuned}


def test_summary_splits_requests_at_the_switch_and_compares_outputs():
    eager = {"rows": [_row(0, 0.01, False)], "checks": [torch.zeros(2)]}
    jit = {
        "rows": [_row(0.0, 0.02, False), _row(0.1, 0.5, False), _row(0.7, 0.004, True), _row(0.8, 0.006, True),
                 _row(0.9, 0.008, True)],
        "checks": [torch.tensor([0.0, 1e-6])], "root_state": "tuned",
    }
    summary = report.summarize(jit, eager)
    assert summary["time_to_tuned_s"] == 0.7 + 0.004
    assert summary["during_max_ms"] == 500.0 and summary["during_p50_ms"] == (20.0 + 500.0) / 2
    assert summary["after_p50_ms"] == 7.0  # the first tuned request is left out of the steady state
    slow_first = dict(jit, rows=[_row(0.0, 0.9, False), *jit["rows"][1:]])
    assert report.summarize(slow_first, eager)["during_max_after_first_ms"] == 500.0  # start-up reported apart
    assert abs(summary["max_abs_diff_vs_eager"] - 1e-6) < 1e-9
    assert summary["root_state"] == "tuned"
    assert "launch_to_tuned_s" not in summary  # (a run written before the launch clock)
    assert summary["due_during_p99_ms"] is None  # (nor the due times)
    late = dict(jit, rows=[dict(r, late_s=0.0) for r in jit["rows"]])
    late["rows"][1]["late_s"] = 0.25  # woke from its pause, then waited 250 ms for the GIL before the call
    due = report.summarize(late, eager)
    assert due["due_during_max_after_first_ms"] == 750.0 and due["during_max_after_first_ms"] == 500.0
    launched = report.summarize(dict(jit, launch_to_start_s=3.0), eager)
    assert abs(launched["launch_to_tuned_s"] - 3.704) < 1e-9  # interpreter start, imports and set-up count


def test_percentiles_ratios_and_failed_runs():
    assert report._pct([], 0.99) is None
    assert report._pct([3.0, 1.0, 2.0], 0.5) == 2.0 and report._pct(list(range(101)), 0.99) == 99
    assert report._ratio(1.0, 4.0) == 0.25 and report._ratio(None, 1.0) is None and report._ratio(1.0, 0) is None
    assert report.summarize({"error": "boom"}, None) == {"error": "boom"}


def test_ratios_compare_the_cold_run_with_eager_and_compile():
    rows = {c: {} for c in bench.CONTENDERS}
    rows["eager"] = {"during_p50_ms": 10.0}
    rows["jit-cold"] = {"during_p99_ms": 30.0, "during_max_ms": 60.0, "time_to_tuned_s": 40.0, "after_p50_ms": 5.0,
                        "launch_to_tuned_s": 45.0}
    rows["jit-warm"] = {"time_to_tuned_s": 4.0, "launch_to_tuned_s": 9.0}
    # torch.compile's time-to-tuned (its compile() line and first request) is the reference, not the first call alone
    rows["compile-cold"] = {"first_call_s": 18.0, "time_to_tuned_s": 20.0, "after_p50_ms": 5.0,
                            "launch_to_tuned_s": 30.0}
    rows["compile-warm"] = {"first_call_s": 6.0, "time_to_tuned_s": 8.0, "launch_to_tuned_s": 12.0}
    rows["jit-blocking"] = {"after_p50_ms": 5.0}
    eager_rows = [_row(0, 0.010, False)] * 98 + [_row(0, 0.015, False)] * 2  # p99: the 99th of 100
    ratio = report.ratios(rows, eager_rows)
    assert abs(ratio["during_p99_over_eager_p99"] - 30.0 / 15.0) < 1e-9
    assert abs(ratio["during_max_over_eager_p99"] - 4.0) < 1e-9
    assert ratio["cold_time_to_tuned_over_compile_first_call"] == 2.0
    assert ratio["warm_over_cold_time_to_tuned"] == 0.1
    assert ratio["warm_time_to_tuned_over_warm_compile_first_call"] == 0.5
    assert ratio["steady_background_over_blocking"] == 1.0 and ratio["steady_jit_over_compile"] == 1.0
    assert ratio["cold_launch_to_tuned_over_compile"] == 1.5 and ratio["warm_launch_to_tuned_over_cold"] == 0.2
    assert ratio["warm_launch_to_tuned_over_compile_warm"] == 0.75
    rows["eager"]["due_during_p99_ms"] = 20.0
    rows["jit-cold"].update(due_during_p99_ms=50.0, due_during_max_after_first_ms=100.0)
    ratio = report.ratios(rows, eager_rows)
    assert ratio["due_during_p99_over_eager"] == 2.5 and ratio["due_during_max_after_first_over_eager_p99"] == 5.0


def test_latencies_while_tuning_are_split_by_the_jobs_step():
    rows = [dict(_row(0.0, 0.5, False), late_s=0.0, phase=None)]  # the first request: left out (start-up)
    for i, (phase, latency) in enumerate([("Building X", 0.010), ("Validating X", 0.080), ("Validating X", 0.060),
                                          (None, 0.008), ("Profiling X", 0.020)]):
        rows.append(dict(_row(0.1 * (i + 1), latency, False), late_s=0.0, phase=phase))
    rows.append(dict(_row(1.0, 0.004, True), late_s=0.0, phase=None, tuning=False))  # after: not counted
    by_phase = report.summarize({"rows": rows}, None)["due_during_by_phase"]
    assert set(by_phase) == {"Building", "Validating", "Profiling", "other"}
    assert by_phase["Validating"]["count"] == 2 and by_phase["Validating"]["max_ms"] == 80.0
    assert by_phase["other"]["count"] == 1 and by_phase["other"]["p50_ms"] == 8.0

