"""compile_exclusion: a node's transition waits for another thread's dynamo compile, and a compile for it."""

from __future__ import annotations

import sys
import threading

import jit_helpers
import pytest
import torch
import torch._dynamo.convert_frame as convert_frame
from jit_helpers import make_mlp, run

from aitune_jit import compile_exclusion
from aitune_jit.outcome import TuningOutcome
from aitune_jit.state import NodeState


def _in_thread(fn) -> tuple[threading.Thread, threading.Event]:
    done = threading.Event()

    def body() -> None:
        fn()
        done.set()

    thread = threading.Thread(target=body)
    thread.start()
    return thread, done


def test_the_block_waits_while_another_thread_compiles() -> None:
    def transition() -> None:
        with compile_exclusion.excluding_compiles():
            pass

    with convert_frame.compile_lock:  # another thread's compile, as dynamo holds it
        thread, done = _in_thread(transition)
        assert not done.wait(0.3)
    thread.join(10)
    assert done.is_set()


def test_a_compile_waits_for_the_block() -> None:
    entered, release = threading.Event(), threading.Event()

    def transition() -> None:
        with compile_exclusion.excluding_compiles():
            entered.set()
            release.wait(10)

    thread, _done = _in_thread(transition)
    assert entered.wait(10)
    assert not convert_frame.compile_lock.acquire(timeout=0.2)  # dynamo's `_compile` would wait here
    release.set()
    thread.join(10)
    assert convert_frame.compile_lock.acquire(timeout=5)
    convert_frame.compile_lock.release()


def test_without_dynamo_loaded_nothing_is_waited_for(monkeypatch) -> None:
    monkeypatch.delitem(sys.modules, "torch._dynamo.convert_frame")
    with convert_frame.compile_lock:
        thread, done = _in_thread(lambda: compile_exclusion.excluding_compiles().__enter__())
        assert done.wait(5)
    thread.join(5)


def test_a_compile_that_never_ends_is_waited_for_only_so_long(monkeypatch) -> None:
    monkeypatch.setattr(compile_exclusion, "WAIT_S", 0.2)
    with convert_frame.compile_lock:
        thread, done = _in_thread(lambda: compile_exclusion.excluding_compiles().__enter__())
        assert done.wait(5)
    thread.join(5)


@pytest.fixture
def recording_mlp():
    return jit_helpers.recording_mlp()


def test_a_node_changes_the_programs_module_only_after_the_compile_on_another_thread(recording_mlp) -> None:
    model, node = recording_mlp
    with convert_frame.compile_lock:
        thread, done = _in_thread(lambda: node.apply(TuningOutcome.eager("too cheap", reopen=False)))
        assert not done.wait(0.3)
        assert "forward" in model.__dict__ and node.state is NodeState.RECORDING  # what dynamo guards on stays
    thread.join(10)
    assert done.is_set() and node.state is NodeState.EAGER and "forward" not in model.__dict__
    torch.testing.assert_close(run(model, [2])[0], run(make_mlp(), [2])[0])


def test_a_caller_that_must_not_wait_is_told_another_thread_compiles() -> None:
    held: list[bool] = []
    with convert_frame.compile_lock:
        thread, done = _in_thread(lambda: held.append(compile_exclusion.excluding_compiles(wait_s=0).__enter__()))
        assert done.wait(5) and held == [False]
    thread.join(5)
    with compile_exclusion.excluding_compiles(wait_s=0) as alone:
        assert alone
