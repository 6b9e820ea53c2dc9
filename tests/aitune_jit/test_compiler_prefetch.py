"""aitune_jit/compiler_prefetch.py: a process whose JIT cache holds a CPU Inductor decision made here (same torch,
Python, aitune) runs torch's compiler set-up on a worker side job from `enable`; any other cache starts nothing;
the side job steps aside like a job and is cancelled when the program ends."""

from __future__ import annotations

import os
import threading
import time

import pytest
from jit_helpers import run_exit_hook

from aitune_core.checkpoint.manifest import versions
from aitune_core.decision_store import Decision, DecisionStore
from aitune_jit import compiler_prefetch, decisions, job_cancel, worker
from aitune_jit import worker_yield as wy
from aitune_jit.config import jit_config


def _decision(key: str = "ab" * 32, backend: str = "TorchInductorBackend", device: str = "cpu",
              **environment: str) -> Decision:
    return Decision(key=key, kind="backend", backend_type=backend, backend_config={},
                    environment={**versions(), "device": device, **environment})


def test_only_inductor_decisions_made_with_these_versions_count():
    eager = Decision(key="cd" * 32, kind="eager", reason="graph break", environment={**versions(), "device": "cpu"})
    entries = [None, eager, _decision(backend="TorchEagerBackend"), _decision(torch="0.0.1"),
               _decision(python="2.7.18")]
    assert compiler_prefetch.wanted_devices(entries) == set()
    assert compiler_prefetch.wanted_devices([*entries, _decision(device="cuda"), _decision()]) == {"cuda", "cpu"}


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process that has not started the prefetch, with its own cache folder; the prefetch itself recorded."""
    monkeypatch.setattr(compiler_prefetch, "_started", False)
    monkeypatch.setattr(jit_config, "cache_dir", str(tmp_path))
    monkeypatch.delenv("AITUNE_WORKER_PREFETCH", raising=False)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "-")  # (restored after the test: `start` points it)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.setattr(decisions, "_pointed", None)
    calls = []
    done = threading.Event()

    def recorded(devices, imported=None):
        calls.append((devices, threading.current_thread().name, wy.jobs_stepping_aside()))
        done.set()

    monkeypatch.setattr(compiler_prefetch, "prefetch", recorded)
    return tmp_path, calls, done


def test_a_warm_cache_starts_the_prefetch_once_on_a_side_job_that_steps_aside(fresh, monkeypatch):
    folder, calls, done = fresh
    DecisionStore(folder).put(_decision())
    monkeypatch.setenv("AITUNE_WORKER_YIELD_MS", "25")
    assert compiler_prefetch.start() is True
    assert done.wait(10)
    assert calls == [({"cpu"}, "aitune-compiler-prefetch", True)]
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(folder.absolute() / "inductor")  # (the CPU check writes)
    assert compiler_prefetch.start() is False  # once per process


def test_no_prefetch_without_a_usable_decision_or_when_turned_off(fresh, monkeypatch):
    folder, calls, _ = fresh
    assert compiler_prefetch.start() is False  # no cache folder yet
    compiler_prefetch._started = False
    DecisionStore(folder).put(_decision(torch="0.0.1"))  # another torch's decision
    assert compiler_prefetch.start() is False
    compiler_prefetch._started = False
    DecisionStore(folder).put(_decision(key="12" * 32, device="cuda"))  # a GPU's: the import alone (docstring)
    assert compiler_prefetch.start() is False
    compiler_prefetch._started = False
    DecisionStore(folder).put(_decision(key="ef" * 32))
    monkeypatch.setenv("AITUNE_WORKER_PREFETCH", "off")
    assert compiler_prefetch.start() is False
    time.sleep(0.05)
    assert calls == []


def test_a_damaged_entry_is_skipped_with_the_stores_warning(fresh, caplog):
    folder, calls, done = fresh
    store = DecisionStore(folder)
    store.put(_decision())
    bad = store.put(_decision(key="ef" * 32))
    bad.write_text(bad.read_text()[:50])  # (the newer one)
    assert compiler_prefetch.start() is True and done.wait(10)
    assert calls[0][0] == {"cpu"} and "Ignoring aitune cache entry" in caplog.text


def test_the_side_job_is_cancelled_when_the_program_ends():
    """At exit a side job is cancelled at once, like an abandoned job: no thread left in torch's code."""
    seen = []

    def step() -> int:
        return sum(range(100))

    def spin() -> None:
        seen.append("started")
        try:
            while True:
                step()  # (Python calls, as the compiler's: the cancel is raised at one's start)
        except worker.TuningCancelled:
            seen.append("cancelled")
            raise

    thread = worker.start_side_job("test-spin", spin)
    while not seen:
        time.sleep(0.01)
    begin = time.monotonic()
    run_exit_hook()
    assert job_cancel.resting(thread) and seen == ["started", "cancelled"]  # (ended its work, waits for the exit)
    assert time.monotonic() - begin < job_cancel.COOPERATIVE_WAIT_S  # cancelled first, at a function start


def test_the_prefetch_imports_the_compiler_modules(monkeypatch):
    imported = []
    monkeypatch.setattr(compiler_prefetch.importlib, "import_module", imported.append)
    checked = []
    from torch._inductor import cpu_vec_isa

    monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", lambda: checked.append(True))
    compiler_prefetch.prefetch({"cuda"})
    assert imported == list(compiler_prefetch.MODULES) and checked == []
    signalled = threading.Event()
    monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", lambda: checked.append(signalled.is_set()))
    compiler_prefetch.prefetch({"cpu"}, signalled)
    assert checked == [True]  # the imports were announced before the check (a tuning job waits only for those)


def test_a_process_that_will_rebuild_a_decision_imports_dynamo_at_once(fresh, monkeypatch):
    # aitune no longer imports dynamo at start-up; a warm process's first job would then import it while its
    # requests wait, so the import stays at start-up for a cache with a decision this process can rebuild
    folder, _calls, _done = fresh
    imported = []
    monkeypatch.setattr(compiler_prefetch.importlib, "import_module", lambda name: imported.append(name))
    assert compiler_prefetch.start() is False and imported == []  # no decision: nothing imported
    compiler_prefetch._started = False
    DecisionStore(folder).put(_decision(device="cuda"))  # a GPU's decision: no prefetch, but dynamo is imported
    assert compiler_prefetch.start() is False and imported == [compiler_prefetch.DYNAMO]
