"""fork_safety: a program that forks while a tuning job runs gets a child that does not hang, and both tune."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch._dynamo.convert_frame as convert_frame
from jit_helpers import CountingBackend, make_mlp, run

from aitune_jit import fork_safety, worker, worker_yield
from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.switch import enable

SCRIPTS = Path(__file__).parent / "scripts"


def _reports(done: subprocess.CompletedProcess) -> dict[str, dict]:
    reports = {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines()
               if line.startswith(("CHILD-REPORT ", "PARENT-REPORT "))}
    assert set(reports) == {"CHILD-REPORT", "PARENT-REPORT"}, done.stdout + done.stderr[-3000:]
    return reports


def _run(script: str, *args: str) -> dict[str, dict]:
    done = subprocess.run([sys.executable, str(SCRIPTS / script), *args], capture_output=True, text=True,
                          timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return _reports(done)


def test_a_fork_while_the_job_imports_a_module_waits_for_that_import_and_both_tune(tmp_path):
    reports = _run("fork_while_tuning.py", str(tmp_path))
    child, parent = reports["CHILD-REPORT"], reports["PARENT-REPORT"]
    assert child["import_s"] < 1  # the parent's job had finished the import: no lock held by a missing thread
    assert child["state"] == "TUNED" and child["wrong"] == 0  # the node being tuned at the fork records again there
    assert parent["state"] == "TUNED" and parent["wrong"] == 0
    assert len(parent["history"]) == 1  # the parent's job was not interrupted: one tuning


@pytest.mark.slow
@pytest.mark.xfail(torch.cuda.is_available(), strict=True, reason="dynamo initialised CUDA in the parent's job (its "
                   "compiles read the CUDA random state), so the child's own compile cannot re-initialise it (README, "
                   "Limitations)")
def test_a_child_forked_while_the_job_compiles_can_compile_itself(tmp_path):
    """The job holds dynamo's compile lock during its Inductor compile: the child gets a free one."""
    reports = _run("fork_mid_compile.py", str(tmp_path))
    assert reports["CHILD-REPORT"]["answer"] == [1.0, 1.0, 1.0, 1.0]
    assert reports["PARENT-REPORT"]["wrong"] == 0 and reports["PARENT-REPORT"]["state"] in ("TUNED", "EAGER")


def test_forks_made_by_aitune_threads_and_without_a_worker_change_nothing(monkeypatch):
    calls = []
    monkeypatch.setattr(worker, "hold_for_fork", lambda held: calls.append(held) or (None, []))
    thread = threading.Thread(target=fork_safety._before_fork, name="aitune-tuning-job")
    thread.start()
    thread.join()
    fork_safety._after_fork_in_parent()
    assert calls == []  # an aitune thread's fork: nothing held, nothing released
    fork_safety._before_fork()
    fork_safety._after_fork_in_parent()
    assert calls == [True, False]


def test_dynamo_s_compile_lock_held_by_a_missing_thread_is_replaced_and_a_free_one_kept(monkeypatch):
    free = convert_frame.compile_lock
    fork_safety._free_dynamo_compile_lock()
    assert convert_frame.compile_lock is free
    held, taken, done = free.__class__(), threading.Event(), threading.Event()

    def hold() -> None:
        with held:
            taken.set()
            done.wait(10)

    monkeypatch.setattr(convert_frame, "compile_lock", held)
    holder = threading.Thread(target=hold)
    holder.start()
    taken.wait(10)
    try:
        fork_safety._free_dynamo_compile_lock()  # (as in a child, where the holder does not exist)
        fresh = convert_frame.compile_lock
        assert fresh is not held and fresh.acquire(blocking=False)
        fresh.release()
    finally:
        done.set()
        holder.join()


def test_a_node_reopened_after_a_fork_records_again_with_a_free_tuning_lock():
    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False
    jit_config.min_parameters = 0
    enable()
    model = make_mlp()
    run(model, [2])
    node = PatchedModule.of(model)
    child = node.children[0]
    held = node._tune_lock
    held.acquire()  # (the parent's job thread held it at the fork)
    try:
        child._tuning = True
        child.reopen_after_fork()
        assert not child._tuning
        assert node._tune_lock is not held and child._tune_lock is node._tune_lock
        assert node._tune_lock.acquire(blocking=False)
        node._tune_lock.release()
    finally:
        held.release()


def _tick() -> None:
    """One Python call: a function start, where a gate may park."""


def _busy_job(stop: list[bool], counts: list[int]) -> None:
    with worker_yield.steps_aside():
        while not stop:
            _tick()
            counts[0] += 1


def _until(condition, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    return condition()


def test_a_fork_waits_until_the_running_job_is_parked_and_lets_it_go_after(monkeypatch):
    """Parked at a function start, the job is in none of torch's C++ code: a child forked while it initialized an
    operator's static hung in that static's guard for good."""
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "5000")
    stop, counts = [], [0]
    thread = threading.Thread(target=_busy_job, args=(stop, counts), name="aitune-tuning-job", daemon=True)
    thread.start()
    assert _until(lambda: counts[0] > 0)
    monkeypatch.setattr(worker, "live_job_threads", lambda: [(thread, threading.Event())])
    fork_safety._before_fork()
    try:
        assert worker_yield.gate_of(thread.ident) == "parked"
        parked_at = counts[0]
        time.sleep(0.05)
        assert counts[0] == parked_at
    finally:
        fork_safety._after_fork_in_parent()
    assert _until(lambda: counts[0] > parked_at)
    stop.append(True)
    thread.join(5)


def test_a_job_thread_s_fork_state():
    stop, counts = [], [0]
    busy = threading.Thread(target=_busy_job, args=(stop, counts), daemon=True)
    busy.start()
    assert _until(lambda: counts[0] > 0)
    waits, finished = threading.Event(), threading.Event()
    idle = threading.Thread(target=waits.wait, args=(10,), daemon=True)
    idle.start()
    try:
        assert fork_safety._fork_state(busy, threading.Event()) == "running"  # (gated, no fork under way)
        assert fork_safety._fork_state(idle, threading.Event()) == "waiting"  # (in threading's code)
        finished.set()
        assert fork_safety._fork_state(busy, finished) == "finished"
    finally:
        stop.append(True)
        waits.set()
        busy.join(5)
        idle.join(5)
    assert fork_safety._fork_state(idle, threading.Event()) == "finished"  # (its thread ended)
