"""aitune_jit/worker_yield.py and forks: while a fork is prepared the job's gate parks it at a function start
outside any import, and goes on after the fork; a forked child starts with no gate state and free locks."""

from __future__ import annotations

import sys
import threading
import time

import pytest
from test_worker_yield import _finish, _Job, _start, _tick, mechanism  # noqa: F401 (mechanism: a fixture)

from aitune_jit import park_spots
from aitune_jit import worker_yield as wy


@pytest.fixture
def job(monkeypatch, mechanism):  # noqa: F811 (the fixture it takes)
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "5000")
    thread = _start(_Job())
    yield thread
    _finish(thread)


def test_a_forked_child_starts_with_no_gate_state_and_a_free_lock(monkeypatch):
    """A child forked while a job's gate held `_lock` and counted a job would wait for that lock for good and count
    its calls as requests: the child's hook makes both anew (`_after_fork_in_child`, run here as the child would)."""
    held, taken, done = threading.Lock(), threading.Event(), threading.Event()
    monkeypatch.setattr(wy, "_lock", held)
    monkeypatch.setattr(wy, "_cond", threading.Condition(held))
    monkeypatch.setattr(wy, "_jobs", 1)
    monkeypatch.setattr(wy, "_gates", {12345: object()})

    def hold() -> None:
        with held:
            taken.set()
            done.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    taken.wait(10)
    try:
        wy._after_fork_in_child()
        assert not wy.jobs_stepping_aside() and wy._gates == {}
        wy.request_started()  # (with the old lock: waits for good)
        wy.request_finished()
    finally:
        done.set()
        holder.join()


def test_a_gate_parks_while_a_fork_is_prepared_and_goes_on_after_it(job):
    """`fork_begins`: the job parks at its next function start (in none of torch's C++ code) until `fork_ended`."""
    wy.fork_begins()
    try:
        deadline = time.monotonic() + 5
        while wy.gate_of(job.ident) != "parked" and time.monotonic() < deadline:
            wy.wait_for_parking(0.01)
        assert wy.gate_of(job.ident) == "parked"
        parked_at = job.count
        time.sleep(0.1)
        assert job.count == parked_at
    finally:
        wy.fork_ended()
    deadline = time.monotonic() + 5
    while job.count == parked_at and time.monotonic() < deadline:
        time.sleep(0.01)
    assert job.count > parked_at and wy.gate_of(job.ident) == "on"


def test_a_gate_inside_an_import_parks_only_once_the_import_is_done(monkeypatch, tmp_path):
    """A job parked inside an import would hand the child that module's import lock held."""
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "5000")
    (tmp_path / "slow_import_for_parking.py").write_text(
        "import sys\nimport worker_yield_parking_probe as probe\n"
        "probe.seen.append(probe.importing(sys._getframe()))\nprobe.inside.set()\n"
        "while not probe.leave.is_set():\n    probe.tick()\n")
    probe = type(sys)("worker_yield_parking_probe")
    probe.inside, probe.leave, probe.tick, probe.importing, probe.seen = (
        threading.Event(), threading.Event(), _tick, park_spots.importing, [])
    monkeypatch.setitem(sys.modules, "worker_yield_parking_probe", probe)
    monkeypatch.syspath_prepend(str(tmp_path))
    idents, after, stop = [], [], threading.Event()

    def body() -> None:
        with wy.steps_aside():
            idents.append(threading.get_ident())
            import slow_import_for_parking  # noqa: F401

            after.append(True)  # (a C call: no function start, where the gate would park first)
            while not stop.is_set():
                _tick()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    assert probe.inside.wait(5)
    assert probe.seen == [True] and not park_spots.importing(sys._getframe())
    wy.fork_begins()
    try:
        time.sleep(0.1)
        assert wy.gate_of(idents[0]) == "on"  # (still importing: not parked)
        probe.leave.set()
        deadline = time.monotonic() + 5
        while wy.gate_of(idents[0]) != "parked" and time.monotonic() < deadline:
            wy.wait_for_parking(0.01)
        assert wy.gate_of(idents[0]) == "parked" and after == [True]
    finally:
        wy.fork_ended()
        stop.set()
        thread.join(5)
        sys.modules.pop("slow_import_for_parking", None)
    assert wy.gate_of(idents[0]) is None  # (its gate came off with the job)


def _parked_within(ident: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while wy.gate_of(ident) != "parked" and time.monotonic() < deadline:
        wy.wait_for_parking(0.01)
    return wy.gate_of(ident) == "parked"


def test_a_job_waiting_for_a_request_parks_as_soon_as_a_fork_begins(job):
    """Its wait (5 s here) ends when the fork begins, and it parks before the body of the function it was
    starting runs."""
    wy.request_started()
    try:
        time.sleep(0.05)  # (the job waits for the request)
        began = time.monotonic()
        wy.fork_begins()
        try:
            assert _parked_within(job.ident, 2) and time.monotonic() - began < 2
        finally:
            wy.fork_ended()
    finally:
        wy.request_finished()


def test_the_park_limit_holds_for_the_whole_fork_not_for_each_park(job, monkeypatch):
    """A fork whose end never comes holds the job for `PARK_LIMIT_S` once; the job then runs on."""
    monkeypatch.setattr(wy, "PARK_LIMIT_S", 0.2)
    wy.fork_begins()
    try:
        assert _parked_within(job.ident, 2)
        time.sleep(0.3)
        at = job.count
        time.sleep(0.2)
        assert job.count > at + 100 and wy.gate_of(job.ident) == "on"  # (it parks again at no later start)
    finally:
        wy.fork_ended()
