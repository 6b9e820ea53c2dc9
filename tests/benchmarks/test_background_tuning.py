"""The background-tuning benchmark's arithmetic: what counts as during/after tuning, time-to-tuned, ratios."""

from __future__ import annotations

import torch

from benchmarks import background_tuning as bench


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
    assert abs(summary["max_abs_diff_vs_eager"] - 1e-6) < 1e-9
    assert summary["root_state"] == "tuned"


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
