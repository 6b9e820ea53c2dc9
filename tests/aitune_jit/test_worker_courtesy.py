"""aitune_jit/worker_courtesy.py: a tuning job lowers the switch interval and keeps collections small, and puts
everything back afterwards, whatever the job raised."""

from __future__ import annotations

import gc
import logging
import sys

import pytest

from aitune_jit import worker_courtesy as wc


def test_switch_interval_is_lowered_during_the_job_and_restored(monkeypatch):
    monkeypatch.delenv("AITUNE_WORKER_SWITCH_US", raising=False)
    before = sys.getswitchinterval()
    with wc.courteous():
        assert sys.getswitchinterval() == pytest.approx(wc.DEFAULT_SWITCH_INTERVAL_S, rel=0.01)
    assert sys.getswitchinterval() == before
    monkeypatch.setenv("AITUNE_WORKER_SWITCH_US", "0")  # leave the interpreter's own
    with wc.courteous():
        assert sys.getswitchinterval() == before


def test_freeze_hides_the_old_heap_during_the_job_and_gives_it_back(monkeypatch):
    monkeypatch.delenv("AITUNE_WORKER_GC", raising=False)
    assert gc.get_freeze_count() == 0
    with wc.courteous():
        assert gc.get_freeze_count() > 0 and gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_pause_turns_automatic_collection_off_and_back_on_even_when_the_job_fails(monkeypatch):
    monkeypatch.setenv("AITUNE_WORKER_GC", "pause")
    before = sys.getswitchinterval()
    with pytest.raises(RuntimeError), wc.courteous():
        assert not gc.isenabled()
        raise RuntimeError("the job failed")
    assert gc.isenabled() and sys.getswitchinterval() == before


def test_bad_values_warn_and_fall_back_to_the_defaults(monkeypatch, caplog):
    monkeypatch.setenv("AITUNE_WORKER_GC", "sometimes")
    monkeypatch.setenv("AITUNE_WORKER_SWITCH_US", "fast")
    with caplog.at_level(logging.WARNING, logger="aitune.jit"):
        assert wc.gc_policy() == "freeze"
        assert wc.switch_interval_s() == pytest.approx(wc.DEFAULT_SWITCH_INTERVAL_S)
    assert "AITUNE_WORKER_GC" in caplog.text and "AITUNE_WORKER_SWITCH_US" in caplog.text
