"""benchmarks/probes/exit_under_tuning.py: what one process's end reports, and the tally per variant."""

from __future__ import annotations

from typing import Any

from benchmarks.probes import exit_under_tuning as probe


def _fake_run(result: dict[str, Any]):
    def run(contender, model, schedule, options, scratch):
        assert (model, schedule) == ("tiny_resnet", "mixed")
        assert options.stall_ms > 1e6  # (no stack sampling: the probe counts exits)
        return {**result, "contender": contender}
    return run


def _args(**kw: Any):
    import argparse

    base = dict(device="cpu", requests=10, after=2, interval_ms=1.0, timeout_s=5.0)
    return argparse.Namespace(**{**base, **kw})


def test_a_crash_keeps_the_fault_handlers_first_lines(monkeypatch):
    tail = "noise\nFatal Python error: Segmentation fault\n\nThread 0x1 (most recent call first):\n  File x"
    monkeypatch.setattr(probe.background_tuning, "_run", _fake_run(
        {"exit_status": -11, "stderr_tail": tail, "summary": ["  ⏳ still tuning more shapes at exit: M"],
         "root_state": "tuned"}))
    row = probe.one_process("gate", "tiny_resnet", _args())
    assert row["exit_status"] == -11 and row["tuning_at_exit"] is True
    assert row["fault"].startswith("Fatal Python error: Segmentation fault")


def test_a_clean_exit_has_no_fault_and_the_nogate_variant_runs_its_own_contender(monkeypatch):
    seen = []

    def run(contender, model, schedule, options, scratch):
        seen.append(contender)
        return {"exit_status": 0, "summary": [], "root_state": "tuned"}

    monkeypatch.setattr(probe.background_tuning, "_run", run)
    row = probe.one_process("nogate", "tiny_resnet", _args())
    assert seen == ["jit-cold-nostep"]
    assert row["exit_status"] == 0 and "fault" not in row and row["tuning_at_exit"] is False


def test_a_process_that_wrote_nothing_is_a_bad_exit(monkeypatch):
    monkeypatch.setattr(probe.background_tuning, "_run", _fake_run({"error": "exit status 1"}))
    row = probe.one_process("gate", "tiny_resnet", _args())
    assert row["exit_status"] is None and row["error"] == "exit status 1"
    assert probe.tally([row])[0]["bad_exits"] == 1


def test_tally_counts_per_variant():
    rows = [{"variant": "gate", "exit_status": 0, "tuning_at_exit": True},
            {"variant": "gate", "exit_status": -11, "tuning_at_exit": True},
            {"variant": "nogate", "exit_status": 0, "tuning_at_exit": False}]
    by = {s["variant"]: s for s in probe.tally(rows)}
    assert by["gate"] == {"variant": "gate", "processes": 2, "bad_exits": 1, "signals": [-11],
                          "ended_while_tuning": 2}
    assert by["nogate"]["bad_exits"] == 0 and by["nogate"]["ended_while_tuning"] == 0
