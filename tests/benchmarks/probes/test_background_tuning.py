"""benchmarks/probes/background_tuning.py: what counts as during/after tuning, time-to-tuned, ratios, stalls."""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import torch

from benchmarks.probes import background_tuning as bench


def _row(t: float, latency: float, tuned: bool) -> dict:
    return {"t": t, "latency_s": latency, "batch": 1, "seq": 128, "tuned": tuned}


def test_summary_splits_requests_at_the_switch_and_compares_outputs():
    eager = {"rows": [_row(0, 0.01, False)], "checks": [torch.zeros(2)]}
    jit = {
        "rows": [_row(0.0, 0.02, False), _row(0.1, 0.5, False), _row(0.7, 0.004, True), _row(0.8, 0.006, True),
                 _row(0.9, 0.008, True)],
        "checks": [torch.tensor([0.0, 1e-6])], "root_state": "tuned",
    }
    summary = bench.summarize(jit, eager)
    assert summary["time_to_tuned_s"] == 0.7 + 0.004
    assert summary["during_max_ms"] == 500.0 and summary["during_p50_ms"] == (20.0 + 500.0) / 2
    assert summary["after_p50_ms"] == 7.0  # the first tuned request is left out of the steady state
    slow_first = dict(jit, rows=[_row(0.0, 0.9, False), *jit["rows"][1:]])
    assert bench.summarize(slow_first, eager)["during_max_after_first_ms"] == 500.0  # start-up reported apart
    assert abs(summary["max_abs_diff_vs_eager"] - 1e-6) < 1e-9
    assert summary["root_state"] == "tuned"
    assert "launch_to_tuned_s" not in summary  # (a run written before the launch clock)
    launched = bench.summarize(dict(jit, launch_to_start_s=3.0), eager)
    assert abs(launched["launch_to_tuned_s"] - 3.704) < 1e-9  # interpreter start, imports and set-up count


def test_percentiles_ratios_and_failed_runs():
    assert bench._pct([], 0.99) is None
    assert bench._pct([3.0, 1.0, 2.0], 0.5) == 2.0 and bench._pct(list(range(101)), 0.99) == 99
    assert bench._ratio(1.0, 4.0) == 0.25 and bench._ratio(None, 1.0) is None and bench._ratio(1.0, 0) is None
    assert bench.summarize({"error": "boom"}, None) == {"error": "boom"}


def test_request_shapes_follow_the_schedule():
    rng = torch.Generator().manual_seed(0)
    assert [bench._shape("mixed", i, rng)[0] for i in range(8)] == [1, 1, 1, 32, 1, 1, 1, 32]
    lengths = {bench._shape("varlen", i, rng)[1] for i in range(200)}
    assert min(lengths) >= 32 and max(lengths) <= 128 and len(lengths) > 20


def test_stall_sampler_records_where_a_slow_request_waits():
    sampler = bench.StallSampler(stall_s=0.02, period_s=0.005)
    gate = threading.Event()
    sampler.current = (3, time.perf_counter())
    gate.wait(0.15)  # a "request" that waits here for 150 ms
    sampler.current = None
    samples = sampler.samples[3]
    assert 1 <= len(samples) <= 3 and samples[0]["after_ms"] >= 20
    assert any("test_stall_sampler_records_where_a_slow_request_waits" in frame for frame in samples[0]["main"])
    assert 0 not in sampler.samples  # requests that ran fast are not sampled


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
    ratio = bench.ratios(rows, eager_rows)
    assert abs(ratio["during_p99_over_eager_p99"] - 30.0 / 15.0) < 1e-9
    assert abs(ratio["during_max_over_eager_p99"] - 4.0) < 1e-9
    assert ratio["cold_time_to_tuned_over_compile_first_call"] == 2.0
    assert ratio["warm_over_cold_time_to_tuned"] == 0.1
    assert ratio["warm_time_to_tuned_over_warm_compile_first_call"] == 0.5
    assert ratio["steady_background_over_blocking"] == 1.0 and ratio["steady_jit_over_compile"] == 1.0
    assert ratio["cold_launch_to_tuned_over_compile"] == 1.5 and ratio["warm_launch_to_tuned_over_cold"] == 0.2
    assert ratio["warm_launch_to_tuned_over_compile_warm"] == 0.75


def test_a_run_killed_by_a_signal_keeps_the_faulthandler_stacks(tmp_path, monkeypatch):
    stacks = "Fatal Python error: Segmentation fault\n" + "  File x.py, line 1 in f\n" * 400

    def fake_run(command, env, **kwargs):
        assert env["PYTHONFAULTHANDLER"] == "1"
        out = command[command.index("--out") + 1]
        Path(out).write_text('{"rows": []}')
        torch.save([], command[command.index("--check-out") + 1])
        return type("Done", (), {"returncode": -11, "stderr": stacks})()

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    args = argparse.Namespace(requests=10, after=5, device="cpu", interval_ms=20.0,
                              stall_ms=50.0, timeout_s=60.0, packages="off")
    data = bench._run("jit-cold", "tiny_resnet", "mixed", args, tmp_path)
    assert data["exit_status"] == -11
    assert "launch_to_start_s" not in data  # (the fake child wrote no start time)
    assert len(data["stderr_tail"]) > 1000 and data["stderr_tail"].endswith(stacks[-100:])
