"""signal_passthrough: the program's signal-handler exceptions leave a blocking tune and reach the program."""

from __future__ import annotations

import importlib
import signal
import threading
import time

import pytest
import torch
from jit_helpers import CountingBackend, make_mlp, run

from aitune_jit import signal_passthrough
from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.state import NodeState
from aitune_jit.switch import enable

pytestmark = pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="needs signal.setitimer (POSIX)")


class Timeout(Exception):
    """The program's own exception, raised by its SIGALRM handler."""


def _raise_timeout(signum, frame):
    raise Timeout("the program's deadline")


@pytest.fixture
def alarm_handler():
    previous = signal.signal(signal.SIGALRM, _raise_timeout)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def _swallowing(fn):
    """What aitune's backends and strategies do with a build's exception."""
    try:
        fn()
    except Exception:
        return "swallowed"
    return "returned"


def test_inside_the_block_a_handlers_exception_passes_every_except_exception(alarm_handler) -> None:
    with pytest.raises(signal_passthrough.HandlerRaised) as caught, signal_passthrough.passing_through():
        assert signal.getsignal(signal.SIGALRM) is not _raise_timeout
        _swallowing(lambda: signal.raise_signal(signal.SIGALRM))
    assert isinstance(caught.value.exc, Timeout) and caught.value.signum == signal.SIGALRM
    assert signal.getsignal(signal.SIGALRM) is _raise_timeout  # the program's handler is back


def test_a_handler_that_returns_and_the_defaults_are_left_alone(alarm_handler) -> None:
    seen = []
    signal.signal(signal.SIGALRM, lambda signum, frame: seen.append(signum))
    with signal_passthrough.passing_through():
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # raises KeyboardInterrupt already
        assert _swallowing(lambda: signal.raise_signal(signal.SIGALRM)) == "returned"
    assert seen == [signal.SIGALRM]


def test_a_handler_the_program_sets_meanwhile_stays(alarm_handler) -> None:
    def newer(signum, frame):
        return None

    with signal_passthrough.passing_through():
        signal.signal(signal.SIGALRM, newer)
    assert signal.getsignal(signal.SIGALRM) is newer


def test_off_the_main_thread_nothing_is_wrapped(alarm_handler) -> None:
    seen = {}

    def other() -> None:
        with signal_passthrough.passing_through():
            seen["handler"] = signal.getsignal(signal.SIGALRM)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(10)
    assert seen["handler"] is _raise_timeout


def test_a_blocking_tune_interrupted_by_the_programs_alarm_raises_its_exception(alarm_handler) -> None:
    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False
    jit_config.min_parameters = 0
    jit_config.min_samples = 2
    CountingBackend.build_delay_s = 5.0  # the build sleeps; the alarm lands inside it
    importlib.import_module("torch._dynamo")  # (run alone, the alarm landed in sympy's first import: half made)
    model = make_mlp()
    expected = run(make_mlp(), [4, 2])  # (before the hook: an identical MLP, eagerly)
    enable()
    run(model, [2])
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    start = time.perf_counter()
    with pytest.raises(Timeout, match="the program's deadline"):
        run(model, [3])  # the call that makes the graph ready tunes inline
    assert time.perf_counter() - start < 4.0  # not the whole build: the program got its timeout when it fired
    assert signal.getsignal(signal.SIGALRM) is _raise_timeout
    node = PatchedModule.of(model)
    assert node.state is NodeState.EAGER and "interrupted by the program's signal handler" in node.reason
    torch.testing.assert_close(run(model, [4, 2]), expected)  # the program carries on, eagerly
