"""aitune_jit/worker_courtesy.py: a tuning job lowers the switch interval and keeps collections small, and puts
everything back afterwards, whatever the job raised."""

from __future__ import annotations

import gc
import logging
import os
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


def test_an_interval_the_program_sets_while_a_job_runs_is_kept(monkeypatch):
    monkeypatch.delenv("AITUNE_WORKER_SWITCH_US", raising=False)
    before = sys.getswitchinterval()
    try:
        with wc.courteous():
            sys.setswitchinterval(0.002)  # the program's own, made while the job ran
        assert sys.getswitchinterval() == pytest.approx(0.002, rel=0.01)
    finally:
        sys.setswitchinterval(before)


def test_freeze_hides_the_old_heap_during_the_job_and_gives_it_back(monkeypatch):
    monkeypatch.delenv("AITUNE_WORKER_GC", raising=False)
    assert gc.get_freeze_count() <= wc.FROZEN_AT_IMPORT
    with wc.courteous():
        assert gc.get_freeze_count() > wc.FROZEN_AT_IMPORT and gc.isenabled()
    assert gc.get_freeze_count() <= wc.FROZEN_AT_IMPORT


def test_pause_turns_automatic_collection_off_and_back_on_even_when_the_job_fails(monkeypatch):
    monkeypatch.setenv("AITUNE_WORKER_GC", "pause")
    before = sys.getswitchinterval()
    with pytest.raises(RuntimeError), wc.courteous():
        assert not gc.isenabled()
        raise RuntimeError("the job failed")
    assert gc.isenabled() and sys.getswitchinterval() == before


def test_a_program_that_switches_collection_off_during_a_paused_job_keeps_it_off(monkeypatch):
    monkeypatch.setenv("AITUNE_WORKER_GC", "pause")
    original_disable = gc.disable
    try:
        with wc.courteous():
            gc.disable()  # the program's own, made while the job ran
        assert not gc.isenabled() and gc.disable is original_disable
        with wc.courteous():
            gc.disable()
            gc.enable()  # switched off and on again: its last word counts
        assert gc.isenabled()
    finally:
        gc.enable()


def test_bad_values_warn_and_fall_back_to_the_defaults(monkeypatch, caplog):
    monkeypatch.setenv("AITUNE_WORKER_GC", "sometimes")
    monkeypatch.setenv("AITUNE_WORKER_SWITCH_US", "fast")
    with caplog.at_level(logging.WARNING, logger="aitune.jit"):
        assert wc.gc_policy() == "freeze"
        assert wc.switch_interval_s() == pytest.approx(wc.DEFAULT_SWITCH_INTERVAL_S)
    assert "AITUNE_WORKER_GC" in caplog.text and "AITUNE_WORKER_SWITCH_US" in caplog.text


def test_a_program_that_froze_its_heap_keeps_it_frozen(monkeypatch):
    monkeypatch.delenv("AITUNE_WORKER_GC", raising=False)
    keep = [object() for _ in range(10)]  # (a gc-tracked list: something the program froze)
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        assert before > 0
        with wc.courteous():
            # the job froze nothing more (a freeze moves every tracked object: thousands); frozen objects that
            # die meanwhile, on any thread, leave the count
            assert before - 100 <= gc.get_freeze_count() <= before
            assert not gc.isenabled()  # it pauses automatic collection instead
        assert gc.isenabled()
        assert gc.get_freeze_count() >= before - 100  # nothing thawed (a few frozen objects may have died)
    finally:
        gc.unfreeze()
    del keep


def test_a_program_that_freezes_while_a_job_runs_keeps_everything_frozen(monkeypatch):
    monkeypatch.delenv("AITUNE_WORKER_GC", raising=False)
    assert gc.get_freeze_count() <= wc.FROZEN_AT_IMPORT
    try:
        with wc.courteous():
            frozen_by_job = gc.get_freeze_count()
            made_during_job = [[] for _ in range(1000)]
            gc.freeze()  # the program's own freeze, while the job runs
            assert gc.get_freeze_count() >= frozen_by_job + 900  # (a few of the job's frozen objects may die)
        assert gc.get_freeze_count() >= frozen_by_job + 900  # the job's unfreeze would have thawed them too
    finally:
        gc.unfreeze()
    del made_during_job


def test_two_jobs_at_once_freeze_once_and_thaw_after_the_last(monkeypatch):
    # (counted by calls, not by `gc.get_freeze_count()`: another thread of the suite may free frozen objects)
    monkeypatch.delenv("AITUNE_WORKER_GC", raising=False)
    calls = []
    freeze, unfreeze = gc.freeze, gc.unfreeze
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze") or freeze())
    monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze") or unfreeze())
    assert gc.get_freeze_count() <= wc.FROZEN_AT_IMPORT
    with wc.courteous():
        with wc.courteous():
            assert calls == ["freeze"]
        assert calls == ["freeze"]  # the first job still runs: still frozen
    assert calls == ["freeze", "unfreeze"]
    assert gc.get_freeze_count() <= wc.FROZEN_AT_IMPORT


def _frozen(things: list) -> list[bool]:
    """Whether each of `things` sits in the permanent generation, which `gc.get_objects()` leaves out.

    (Asked of the objects themselves, not of `gc.get_freeze_count()`: another thread of the suite may free frozen
    objects.)
    """
    collected = {id(each) for each in gc.get_objects()}
    return [id(thing) not in collected for thing in things]


def test_refreeze_freezes_what_survives_a_full_collection_during_a_job(monkeypatch):
    monkeypatch.setenv("AITUNE_WORKER_GC", "refreeze")
    assert gc.get_freeze_count() <= wc.FROZEN_AT_IMPORT
    with wc.courteous():
        made_by_job = [[] for _ in range(5000)]  # (what a compile leaves behind: it lives on)
        gc.collect()  # a full collection: the survivors join the frozen heap, so the next one skips them
        assert all(_frozen([made_by_job, *made_by_job]))
        gc.collect(0)  # a young collection freezes nothing more
    assert gc.get_freeze_count() <= wc.FROZEN_AT_IMPORT  # all thawed (Python 3.12's own frozen objects too)
    assert wc._freeze_survivors not in gc.callbacks
    del made_by_job


def test_the_default_freezes_only_at_the_start(monkeypatch):
    monkeypatch.delenv("AITUNE_WORKER_GC", raising=False)
    with wc.courteous():
        frozen_at_start = gc.get_freeze_count()
        made_by_job = [[] for _ in range(5000)]
        gc.collect()
        assert frozen_at_start > 0 and not any(_frozen([made_by_job, *made_by_job]))
        assert wc._freeze_survivors not in gc.callbacks
    assert gc.get_freeze_count() <= wc.FROZEN_AT_IMPORT
    del made_by_job


def test_young_keeps_full_collections_for_the_end_and_reads_only_the_jobs_objects_then(monkeypatch):
    monkeypatch.setenv("AITUNE_WORKER_GC", "young")
    program = gc.get_threshold()
    full: list[int] = []

    def on_collection(phase, info):
        if phase == "start" and info["generation"] == wc.OLDEST:
            full.append(gc.get_freeze_count())

    gc.callbacks.append(on_collection)
    try:
        with wc.courteous():
            assert gc.get_threshold() == (*program[:wc.OLDEST], wc.NO_FULL_COLLECTIONS)
            assert full == []
        assert gc.get_threshold() == program
        assert len(full) == 1 and full[0] > wc.FROZEN_AT_IMPORT  # (one, with the old heap still frozen)
        assert gc.get_freeze_count() <= wc.FROZEN_AT_IMPORT
    finally:
        gc.callbacks.remove(on_collection)


def test_young_keeps_thresholds_the_program_set_during_the_job(monkeypatch):
    monkeypatch.setenv("AITUNE_WORKER_GC", "young")
    program = gc.get_threshold()
    try:
        with wc.courteous():
            gc.set_threshold(1000, 20, 20)  # the program's own, made while the job ran
        assert gc.get_threshold() == (1000, 20, 20)
    finally:
        gc.set_threshold(*program)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_process_forked_while_a_job_runs_gets_the_interval_and_the_heap_back(monkeypatch):
    monkeypatch.delenv("AITUNE_WORKER_GC", raising=False)
    monkeypatch.delenv("AITUNE_WORKER_SWITCH_US", raising=False)
    before = sys.getswitchinterval()
    with wc.courteous():
        pid = os.fork()
        if pid == 0:  # the child: a DataLoader worker, a preforked server process
            ok = sys.getswitchinterval() == before and gc.get_freeze_count() <= wc.FROZEN_AT_IMPORT
            with wc.courteous():  # and its own jobs work as in any process
                ok = ok and gc.get_freeze_count() > 0
            os._exit(0 if ok and gc.get_freeze_count() <= wc.FROZEN_AT_IMPORT else 1)
        _, status = os.waitpid(pid, 0)
        assert gc.get_freeze_count() > 0  # the parent's job is untouched
    assert os.waitstatus_to_exitcode(status) == 0
