"""fork_safety: a program that forks while a tuning job runs gets a child that does not hang, and both tune."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from aitune_jit import fork_safety, worker

SCRIPT = Path(__file__).parent / "scripts" / "fork_while_tuning.py"


def _reports(stdout: str) -> dict[str, dict]:
    return {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1]) for line in stdout.splitlines()
            if line.startswith(("CHILD-REPORT ", "PARENT-REPORT "))}


def test_a_child_forked_while_the_job_imports_a_module_imports_it_too_and_both_tune(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    reports = _reports(done.stdout)
    assert set(reports) == {"CHILD-REPORT", "PARENT-REPORT"}, done.stdout + done.stderr[-3000:]
    child, parent = reports["CHILD-REPORT"], reports["PARENT-REPORT"]
    assert child["import_s"] < 10  # (the module's own 3 s, not an import lock the parent's job held at the fork)
    assert child["state"] == "TUNED" and child["wrong"] == 0  # the node queued at the fork records again there
    assert parent["state"] == "TUNED" and parent["wrong"] == 0  # the cancelled job ran again later
    assert any("The program forks while MLP is tuned" in h for h in parent["history"]), parent


def test_forks_made_by_aitune_threads_and_without_a_worker_change_nothing(monkeypatch):
    calls = []
    monkeypatch.setattr(worker, "hold_for_fork", lambda held: calls.append(held) or (None, []))
    seen = []
    thread = threading.Thread(target=lambda: seen.append(fork_safety._before_fork()), name="aitune-tuning-job")
    thread.start()
    thread.join()
    assert seen == [None] and calls == []  # an aitune thread's fork: nothing held, nothing cancelled
    fork_safety._before_fork()
    fork_safety._after_fork_in_parent()
    assert calls == [True, False]


class _Node:
    path = "M"

    def __init__(self):
        self.dropped = 0

    def job_dropped(self):
        self.dropped += 1


class _Job:
    """A running job whose step-aside gate stops it at once when asked (`gate.cancel`)."""

    def __init__(self, node):
        self.path, self.abandoned, self._node = "M", False, node
        self.thread = threading.Thread(target=lambda: None)
        self.finished = threading.Event()
        self.gate = self

    def cancel(self, exc_type):
        self.finished.set()
        return True

    def node_ref(self):
        return self._node


def test_a_nodes_job_is_stopped_by_a_fork_once(monkeypatch):
    """A program that forks more often than a compile lasts must not keep a module from ever being tuned: the
    second fork during the same node's job does not stop it."""
    node = _Node()
    jobs = []

    def hold(held):
        if held:
            jobs.append(_Job(node))
            return jobs[-1], []
        return None, []

    monkeypatch.setattr(worker, "hold_for_fork", hold)
    monkeypatch.setattr(fork_safety, "_stopped_once", set())
    fork_safety._before_fork()
    fork_safety._before_fork()
    assert [job.abandoned for job in jobs] == [True, False] and node.dropped == 1
