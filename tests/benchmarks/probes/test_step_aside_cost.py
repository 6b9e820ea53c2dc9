"""benchmarks/probes/step_aside_cost.py: which gate a process ran under, and the table's medians and ratios."""

from __future__ import annotations

import sys

from benchmarks.probes import step_aside_cost as bench


def test_the_gate_used_follows_the_variables(monkeypatch):
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "0")
    assert bench._gate_used() == "none"
    monkeypatch.delenv("AITUNE_WORKER_YIELD_MS")
    monkeypatch.setenv("AITUNE_WORKER_YIELD_GATE", "profile")
    assert bench._gate_used() == "profile"
    monkeypatch.setenv("AITUNE_WORKER_YIELD_GATE", "trace")
    assert bench._gate_used() == "trace"
    monkeypatch.setenv("AITUNE_WORKER_YIELD_GATE", "monitoring")
    assert bench._gate_used() == ("monitoring" if sys.version_info >= (3, 12) else "trace")
    for variant, env in bench.VARIANTS.items():  # what each variant sets is what the child reports
        monkeypatch.delenv("AITUNE_WORKER_YIELD_MS", raising=False)
        monkeypatch.delenv("AITUNE_WORKER_YIELD_GATE", raising=False)
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        assert bench._gate_used() == variant or (variant == "monitoring" and sys.version_info < (3, 12))


def test_summary_takes_medians_of_tuned_runs_against_no_gate():
    runs = [
        {"variant": "none", "time_to_tuned_s": 2.0, "tuned": True, "gate": "none"},
        {"variant": "none", "time_to_tuned_s": 4.0, "tuned": True, "gate": "none"},
        {"variant": "profile", "time_to_tuned_s": 6.0, "tuned": True, "gate": "profile"},
        {"variant": "profile", "time_to_tuned_s": 99.0, "tuned": False, "gate": "profile"},  # not tuned: left out
        {"variant": "monitoring", "error": "boom", "exit_status": 1},
    ]
    rows = {row["variant"]: row for row in bench._summary(runs, ["none", "profile", "monitoring"])}
    assert rows["none"]["median_s"] == 3.0 and rows["none"]["over_none"] == 1.0
    assert rows["profile"]["runs"] == 1 and rows["profile"]["over_none"] == 2.0
    assert rows["monitoring"]["runs"] == 0 and rows["monitoring"]["median_s"] is None
