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
