"""aitune_jit/worker_compile_process.py: with `AITUNE_WORKER_COMPILE=subprocess` a background job sends Inductor's
code generation to torch's compile process and puts torch's mode back afterwards; the default (`thread`), a
program's own mode, a dead compile process and a fork are respected."""

from __future__ import annotations

import logging
import os
import types

import pytest
import torch
import torch._inductor.compile_fx as compile_fx

from aitune_jit import worker_compile_process as wcp

MODES = compile_fx.FxCompileMode


@pytest.fixture
def fake_pool(monkeypatch):
    """A started compile process without starting one (the mode switching is what these tests check)."""
    pool = types.SimpleNamespace(running=True)
    monkeypatch.setattr(wcp, "_pool", lambda: pool)
    monkeypatch.setattr(wcp, "_broken", False)
    monkeypatch.setenv("AITUNE_WORKER_COMPILE", "subprocess")
    assert compile_fx.fx_compile_mode == MODES.NORMAL
    return pool


def test_the_mode_is_subprocess_during_a_job_and_normal_after_even_when_it_fails(fake_pool):
    with wcp.compiles_in_subprocess() as on:
        assert on and compile_fx.fx_compile_mode == MODES.SUBPROCESS
    assert compile_fx.fx_compile_mode == MODES.NORMAL
    with pytest.raises(RuntimeError), wcp.compiles_in_subprocess():
        raise RuntimeError("the job failed")
    assert compile_fx.fx_compile_mode == MODES.NORMAL


def test_an_abandoned_job_still_running_keeps_the_mode_until_the_last_one_ends(fake_pool):
    first = wcp.compiles_in_subprocess()
    first.__enter__()
    with wcp.compiles_in_subprocess():
        assert compile_fx.fx_compile_mode == MODES.SUBPROCESS
    assert compile_fx.fx_compile_mode == MODES.SUBPROCESS  # the first job still runs
    first.__exit__(None, None, None)
    assert compile_fx.fx_compile_mode == MODES.NORMAL


def test_thread_is_the_default_and_a_wrong_value_warns(fake_pool, monkeypatch, caplog):
    for value in ("thread", None):
        if value is None:
            monkeypatch.delenv("AITUNE_WORKER_COMPILE")
        else:
            monkeypatch.setenv("AITUNE_WORKER_COMPILE", value)
        with wcp.compiles_in_subprocess() as on:
            assert not on and compile_fx.fx_compile_mode == MODES.NORMAL
    monkeypatch.setenv("AITUNE_WORKER_COMPILE", "elsewhere")
    with caplog.at_level(logging.WARNING, logger="aitune.jit"), wcp.compiles_in_subprocess() as on:
        assert not on
    assert "AITUNE_WORKER_COMPILE='elsewhere'" in caplog.text


def test_a_mode_the_program_chose_is_left_alone(fake_pool, monkeypatch):
    monkeypatch.setattr(compile_fx, "fx_compile_mode", MODES.SERIALIZE)
    with wcp.compiles_in_subprocess() as on:
        assert not on and compile_fx.fx_compile_mode == MODES.SERIALIZE
    assert compile_fx.fx_compile_mode == MODES.SERIALIZE


def test_a_dead_compile_process_sends_later_jobs_to_the_job_thread_with_one_warning(fake_pool, caplog):
    fake_pool.running = False
    with caplog.at_level(logging.WARNING, logger="aitune.jit"):
        for _ in range(2):
            with wcp.compiles_in_subprocess() as on:
                assert not on and compile_fx.fx_compile_mode == MODES.NORMAL
    assert caplog.text.count("compile process is not running") == 1
    fake_pool.running = True
    with wcp.compiles_in_subprocess() as on:
        assert not on  # once broken, this process compiles on the job thread


def test_a_forked_child_starts_with_the_normal_mode_and_without_the_parents_process(fake_pool):
    from torch._inductor.compile_fx_subproc import _SubprocessFxCompile

    assert wcp._enter() and compile_fx.fx_compile_mode == MODES.SUBPROCESS  # a job runs in the parent
    wcp._after_fork_in_child()  # what os.register_at_fork runs in the child (where no job thread exists)
    assert compile_fx.fx_compile_mode == MODES.NORMAL and wcp._active == 0
    assert _SubprocessFxCompile.process_pool.cache_info().currsize == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_compile_threads_of_its_own():
    """The parent's compile threads (made by its first compile) do not exist in a forked child; work sent to
    their pool waited forever there (a DataLoader worker compiling under AITUNE_JIT_BLOCKING=1)."""
    from torch._inductor import async_compile

    async_compile.AsyncCompile.pool.cache_clear()
    try:
        with torch._inductor.config.patch(compile_threads=2):
            answer = _child_answer(async_compile)
    finally:
        async_compile.AsyncCompile.pool.cache_clear()  # (a pool of 2 threads is not what the rest of the suite uses)
    assert answer == b"2"


def _child_answer(async_compile: types.ModuleType) -> bytes:
    assert async_compile.AsyncCompile.pool().submit(int, "1").result(timeout=10) == 1  # the parent's threads run
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: os.register_at_fork ran wcp._after_fork_in_child
        try:
            answer = async_compile.AsyncCompile.pool().submit(int, "2").result(timeout=5)
            os.write(write, str(answer).encode())
        except BaseException as exc:  # (any failure is the answer)
            os.write(write, type(exc).__name__.encode())
        os._exit(0)
    os.close(write)
    answer = os.read(read, 64)
    os.waitpid(pid, 0)
    return answer


def test_a_real_compile_runs_in_the_compile_process_and_gives_the_eager_answer(monkeypatch, tmp_path):
    """One real compile through torch's compile process (it is spawned once per test process)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("AITUNE_WORKER_COMPILE", "subprocess")
    counts = compile_fx.FxCompile._compile_stats
    from torch._inductor.compile_fx_subproc import _SubprocessFxCompile

    before = counts[_SubprocessFxCompile].codegen_and_compile
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
    x = torch.randn(4, 8)
    torch._dynamo.reset()
    with wcp.compiles_in_subprocess() as on, torch.no_grad():
        assert on
        compiled = torch.compile(model)
        out = compiled(x)
    torch.testing.assert_close(out, model(x).detach())
    assert counts[_SubprocessFxCompile].codegen_and_compile == before + 1
