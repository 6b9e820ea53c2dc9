"""benchmarks/real_workloads/clock.py: timed calls, and rounds that go on only while aitune's worker is busy."""

from __future__ import annotations

import sys
import types

import pytest

from benchmarks.real_workloads import clock


def test_a_timed_call_returns_its_result_and_appends_its_time():
    times: list[float] = []
    assert clock.timed("cpu", lambda: 42, times) == 42
    assert len(times) == 1 and times[0] >= 0


def test_rounds_are_the_configured_ones_without_aitune(monkeypatch):
    monkeypatch.setattr(clock, "UNTIL_TUNED_S", 10.0)
    monkeypatch.delitem(sys.modules, "aitune_jit.worker", raising=False)
    stamps: dict[str, float] = {}
    assert list(clock.rounds(3, stamps)) == [0, 1, 2] and stamps == {}


@pytest.mark.parametrize("busy_for", [0, 2])
def test_rounds_go_on_while_the_worker_is_busy_then_run_one_idle_cycle_and_the_configured_ones(monkeypatch, busy_for):
    polls = {"n": 0}

    def pending() -> list[str]:
        polls["n"] += 1
        return ["job"] if polls["n"] <= busy_for else []

    monkeypatch.setattr(clock, "UNTIL_TUNED_S", 10.0)
    monkeypatch.setitem(sys.modules, "aitune_jit.worker", types.SimpleNamespace(pending=pending))
    stamps: dict[str, float] = {}
    numbers = list(clock.rounds(2, stamps))
    # configured (2), busy extras, one idle cycle (2), then the configured number again (2)
    assert numbers == list(range(2 + busy_for + 4)) and "tuned_after_s" in stamps
