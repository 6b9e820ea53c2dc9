"""aitune_jit/compiling_flag.py: while JIT tuning is installed, `torch.compiler.is_compiling()` is True only in the
thread that compiles; torch's function and session context come back exactly."""

from __future__ import annotations

import threading

import pytest
import torch

from aitune_jit import compiling_flag
from aitune_jit.switch import disable, enable

pytestmark = pytest.mark.skipif(not compiling_flag._supported(),
                                reason="this torch has no process-wide compile session flag")


def _answers_during_a_compile() -> dict[str, bool]:
    """What `is_compiling()` says inside a compile: in the compiling thread (a backend runs untraced code) and in
    another thread asked at that moment."""
    seen: dict[str, bool] = {}

    def backend(gm, example_inputs):
        other: list[bool] = []
        thread = threading.Thread(target=lambda: other.append(torch.compiler.is_compiling()))
        thread.start()
        thread.join()
        seen["other thread"], seen["compiling thread"] = other[0], torch.compiler.is_compiling()
        return gm

    torch._dynamo.reset()
    torch.compile(lambda x: x * 2 + 1, backend=backend)(torch.randn(3))
    return seen


def test_torchs_flag_is_seen_by_every_thread_without_aitune():
    """The reason for the module: the check below would pass without it if torch's flag were per thread."""
    assert not compiling_flag.installed()
    assert _answers_during_a_compile() == {"other thread": True, "compiling thread": True}


def test_installed_only_the_compiling_thread_sees_a_compile():
    compiling_flag.install()
    try:
        assert _answers_during_a_compile() == {"other thread": False, "compiling thread": True}
        traced: list[bool] = []

        def traced_fn(x):
            traced.append(torch.compiler.is_compiling())  # dynamo folds the call to True while it traces
            return x + 1

        torch.compile(traced_fn, backend="eager")(torch.randn(2))
        assert traced == [True] and torch.compiler.is_compiling() is False
    finally:
        compiling_flag.uninstall()


def test_uninstall_puts_torchs_function_and_context_back_and_enable_installs_it():
    code, context = torch.compiler.is_compiling.__code__, torch.compiler._compile_session_context
    enable()
    assert compiling_flag.installed() and torch.compiler.is_compiling.__code__ is not code
    disable()
    assert not compiling_flag.installed()
    assert torch.compiler.is_compiling.__code__ is code and torch.compiler._compile_session_context is context
    assert not hasattr(torch.compiler, "_aitune_compiling_in_this_thread")
