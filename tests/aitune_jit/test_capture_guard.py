"""aitune_jit/capture_guard.py: a device synchronization waits while another thread captures a CUDA graph (CUDA
forbids it), a capture waits for another thread's synchronization, and torch's functions come back exactly.

torch's CUDA functions are replaced by recorders first, so this runs without a GPU; the guard wraps whatever
`torch.cuda.synchronize` and `CUDAGraph.capture_begin/end` are when it is installed."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from aitune_jit import capture_guard


@pytest.fixture
def fake_cuda(monkeypatch):
    events: list[str] = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: events.append("sync"))
    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", lambda self, *a, **k: events.append("begin"))
    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_end", lambda self: events.append("end"))
    capture_guard.install()
    yield events
    capture_guard.uninstall()
    for fn in (torch.cuda.synchronize, torch.cuda.CUDAGraph.capture_begin, torch.cuda.CUDAGraph.capture_end):
        assert not hasattr(fn, "__wrapped__"), "the guard's wrapper stayed in place"


def _in_thread(fn) -> threading.Thread:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


def test_a_sync_waits_for_another_threads_capture_to_end(fake_cuda):
    graph = object()
    began = threading.Event()
    release = threading.Event()

    def capture():
        torch.cuda.CUDAGraph.capture_begin(graph)
        began.set()
        release.wait(5)
        torch.cuda.CUDAGraph.capture_end(graph)

    capturer = _in_thread(capture)
    assert began.wait(5) and not capture_guard.capturing_here()
    syncer = _in_thread(torch.cuda.synchronize)
    time.sleep(0.1)
    assert fake_cuda == ["begin"]  # the synchronization is held back
    release.set()
    capturer.join(5)
    syncer.join(5)
    assert fake_cuda == ["begin", "end", "sync"]


def test_a_capture_waits_for_another_threads_sync_and_a_thread_may_sync_itself(fake_cuda, monkeypatch):
    in_sync = threading.Event()
    release = threading.Event()

    def slow_sync(device=None):
        in_sync.set()
        release.wait(5)
        fake_cuda.append("sync")

    capture_guard.uninstall()
    monkeypatch.setattr(torch.cuda, "synchronize", slow_sync)
    capture_guard.install()
    syncer = _in_thread(torch.cuda.synchronize)
    assert in_sync.wait(5)
    capturer = _in_thread(lambda: torch.cuda.CUDAGraph.capture_begin(object()))
    time.sleep(0.1)
    assert fake_cuda == []  # the capture is held back
    release.set()
    syncer.join(5)
    capturer.join(5)
    assert fake_cuda == ["sync", "begin"]
    capture_guard._captures.clear()
    torch.cuda.CUDAGraph.capture_begin(object())  # this thread's own capture never makes it wait
    assert capture_guard.capturing_here() and capture_guard.capturing_in(threading.get_ident())
    assert not capture_guard.capturing_in(syncer.ident)  # (another thread, not capturing)
    torch.cuda.CUDAGraph.capture_end(object())
    assert not capture_guard.capturing_here()


def test_a_failed_capture_begin_is_not_counted(fake_cuda, monkeypatch):
    capture_guard.uninstall()

    def failing_begin(self, *args, **kwargs):
        raise RuntimeError("no capture")

    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_begin", failing_begin)
    capture_guard.install()
    with pytest.raises(RuntimeError):
        torch.cuda.CUDAGraph.capture_begin(object())
    assert not capture_guard.capturing_here() and capture_guard._captures == {}


def test_install_is_idempotent_and_uninstall_leaves_a_newer_patch(fake_cuda, monkeypatch):
    wrapped = torch.cuda.synchronize
    capture_guard.install()
    assert torch.cuda.synchronize is wrapped and capture_guard.installed()

    def theirs(device=None):
        return None

    monkeypatch.setattr(torch.cuda, "synchronize", theirs)
    capture_guard.uninstall()
    assert torch.cuda.synchronize is theirs and not capture_guard.installed()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: fake_cuda.append("sync"))
