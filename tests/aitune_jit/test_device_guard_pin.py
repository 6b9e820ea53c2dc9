"""device_guard_pin: torch's stand-in CUDA guard is installed once, on a thread that outlives every tuning job."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from aitune_jit import device_guard_pin


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A process where `pin` has not run yet; returns the names of the threads that made torch's call."""
    calls: list[str] = []
    monkeypatch.setattr(device_guard_pin, "_pinned", False)
    monkeypatch.setattr(device_guard_pin, "needed", lambda: True)
    monkeypatch.setattr(torch._C, "_ensureCUDADeviceGuardSet",
                        lambda: calls.append(threading.current_thread().name), raising=False)
    return calls


def test_the_main_thread_makes_the_call_once(fresh: list[str]) -> None:
    device_guard_pin.pin()
    device_guard_pin.pin()
    assert fresh == [threading.main_thread().name]
    assert device_guard_pin.pinned()


def test_another_thread_hands_the_call_to_a_keeper_that_stays(fresh: list[str]) -> None:
    worker = threading.Thread(target=device_guard_pin.pin, name="request-thread")
    worker.start()
    worker.join()
    assert fresh == ["aitune-device-guard"]
    keepers = [t for t in threading.enumerate() if t.name == "aitune-device-guard"]
    assert keepers and keepers[0].daemon and keepers[0].is_alive()  # (its thread-local stand-in stays valid)


def test_nothing_is_done_where_a_device_answers(fresh: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_guard_pin, "needed", lambda: False)
    device_guard_pin.pin()
    assert fresh == []
    assert device_guard_pin.pinned()


def test_a_failing_call_is_not_the_programs_problem(fresh: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise RuntimeError("no driver")

    monkeypatch.setattr(torch._C, "_ensureCUDADeviceGuardSet", broken, raising=False)
    device_guard_pin.pin()  # (logged at DEBUG, never raised)
    assert device_guard_pin.pinned()


def test_needed_follows_the_device() -> None:
    has_call = hasattr(torch._C, "_ensureCUDADeviceGuardSet")
    assert device_guard_pin.needed() == (has_call and not torch.cuda.is_available())


@pytest.mark.skipif(not (torch.version.cuda and not torch.cuda.is_available()),
                    reason="torch's dangling stand-in exists only on a CUDA build without a CUDA device")
def test_traces_on_threads_that_end_one_after_another_survive() -> None:
    """The case seen: each trace on a thread of its own, after the first thread ended (without `pin` this
    process dies with SIGSEGV on torch 2.11+cu130)."""
    script = textwrap.dedent("""
        import threading, torch
        from aitune_jit import device_guard_pin
        device_guard_pin.pin()
        def trace(i):
            torch.compile(torch.nn.Linear(4, 4), backend="eager")(torch.randn(2 + i, 4))
        for i in range(3):
            t = threading.Thread(target=trace, args=(i,)); t.start(); t.join()
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"
