"""fx_trace_lock: two threads' FX traces take turns, and the process's module calls stay torch's own."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
import torch.fx

from aitune_jit import fx_trace_lock


class _Paused(torch.nn.Module):
    """Traced by one thread: its forward stops halfway until the test lets it go on."""

    def __init__(self, go: threading.Event, inside: threading.Event) -> None:
        super().__init__()
        self.go, self.inside = go, inside
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.inside.set()
        self.go.wait(10)
        return self.lin(x)


def _trace_two_threads() -> tuple[list[BaseException], bool]:
    """Thread A starts a trace and stops inside it; thread B starts one; A is let go first, then B.
    Returns the threads' errors and whether B got inside its trace while A was still in its own."""
    go_a, in_a, go_b, in_b = threading.Event(), threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def trace(module: torch.nn.Module) -> None:
        try:
            torch.fx.symbolic_trace(module)
        except BaseException as exc:  # (collected for the assertion)
            errors.append(exc)

    a = threading.Thread(target=trace, args=(_Paused(go_a, in_a),))
    a.start()
    assert in_a.wait(10)
    b = threading.Thread(target=trace, args=(_Paused(go_b, in_b),))
    b.start()
    overlapped = in_b.wait(0.5)
    go_a.set()
    a.join(10)
    go_b.set()
    b.join(10)
    return errors, overlapped


@pytest.fixture
def original_call():
    import torch.fx._symbolic_trace as fx_trace

    module_dict = dict(torch.nn.Module.__dict__)
    yield torch.nn.Module.__call__
    for name in ("__call__", "__getattr__"):  # (an unprotected run below may leave FX's patches: undo them)
        if torch.nn.Module.__dict__.get(name) is not module_dict.get(name):
            setattr(torch.nn.Module, name, module_dict[name])
    fx_trace.CURRENT_PATCHER = None
    fx_trace._is_fx_tracing_flag = False  # (interleaved traces restore each other's saved flag)
    fx_trace_lock.uninstall()


_HAZARD = """
import sys, threading, torch, torch.fx
sys.path.insert(0, {here!r})
import test_fx_trace_lock as t
errors, overlapped = t._trace_two_threads()
print("overlapped", overlapped)
print("errors", " | ".join(str(e) for e in errors))
go, inside = threading.Event(), threading.Event()
print("plain call", repr(t._during_a_trace(t._Paused(go, inside), go, inside,
                                              lambda: torch.nn.Linear(4, 4)(torch.randn(2, 4))))[:200])
"""


def test_without_the_lock_traces_and_plain_calls_of_other_threads_break(tmp_path) -> None:
    # the hazard itself, in plain torch (in a process of its own: it leaves FX's patches behind). If this
    # fails, torch serializes traces and keeps other threads out of them, and fx_trace_lock can go.
    script = tmp_path / "hazard.py"
    script.write_text(_HAZARD.format(here=str(Path(__file__).parent)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "overlapped True" in done.stdout
    assert "not installed as a submodule" in done.stdout.split("plain call")[0]  # the two traces failed
    assert "NameError" in done.stdout.split("plain call")[1]  # and another thread's plain call too


def test_with_the_lock_the_second_trace_waits_and_both_succeed(original_call) -> None:
    fx_trace_lock.install()
    errors, overlapped = _trace_two_threads()
    assert not overlapped  # B waited for A's trace to end before it started its own
    assert errors == []
    assert torch.nn.Module.__call__ is original_call
    out = torch.nn.Linear(4, 4)(torch.randn(2, 4))  # the program's later module calls are plain calls
    assert out.shape == (2, 4)


def test_nested_traces_on_one_thread_do_not_wait() -> None:
    fx_trace_lock.install()
    try:
        class Outer(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.lin = torch.nn.Linear(3, 3)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.lin(x).relu()

        done = threading.Event()

        def nested() -> None:
            torch.fx.symbolic_trace(Outer())  # outer trace holds the lock ...
            with fx_trace_lock._trace_lock:  # ... and the same thread may take it again
                torch.fx.symbolic_trace(Outer())
            done.set()

        t = threading.Thread(target=nested)
        t.start()
        t.join(10)
        assert done.is_set()
    finally:
        fx_trace_lock.uninstall()


def test_others_waiting_here_is_true_only_on_the_tracing_thread_with_a_waiter(original_call) -> None:
    fx_trace_lock.install()
    seen: dict[str, bool] = {}
    go_a, in_a = threading.Event(), threading.Event()

    class Probe(_Paused):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.inside.set()
            seen["alone"] = fx_trace_lock.others_waiting_here()
            self.go.wait(10)
            seen["with_waiter"] = fx_trace_lock.others_waiting_here()
            return self.lin(x)

    a = threading.Thread(target=torch.fx.symbolic_trace, args=(Probe(go_a, in_a),))
    a.start()
    assert in_a.wait(10)
    b = threading.Thread(target=torch.fx.symbolic_trace, args=(torch.nn.Linear(2, 2),))
    b.start()
    for _ in range(200):
        if fx_trace_lock._waiting:
            break
        threading.Event().wait(0.01)
    seen["other_thread"] = fx_trace_lock.others_waiting_here()
    go_a.set()
    a.join(10)
    b.join(10)
    assert seen == {"alone": False, "with_waiter": True, "other_thread": False}


def test_install_is_idempotent_and_uninstall_restores_torchs_method() -> None:
    original = torch.fx.Tracer.trace
    fx_trace_lock.install()
    patched = torch.fx.Tracer.trace
    fx_trace_lock.install()
    assert fx_trace_lock.installed() and torch.fx.Tracer.trace is patched
    fx_trace_lock.uninstall()
    assert not fx_trace_lock.installed() and torch.fx.Tracer.trace is original


def test_a_wrapper_dynamo_put_around_the_patch_is_switched_off_and_on_again(original_call) -> None:
    # dynamo's first compile wraps Tracer.trace with `disable(...)` once, whatever it is then (TorchPatcher)
    import functools

    before = torch.fx.Tracer.trace
    fx_trace_lock.install()
    ours = torch.fx.Tracer.trace

    @functools.wraps(ours)
    def dynamos(*args, **kwargs):
        return ours(*args, **kwargs)

    torch.fx.Tracer.trace = dynamos
    try:
        fx_trace_lock.uninstall()
        assert torch.fx.Tracer.trace is dynamos and not fx_trace_lock.installed()
        graph = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))  # switched off: torch's own trace, no lock held
        assert isinstance(graph, torch.fx.GraphModule) and fx_trace_lock._holder is None
        fx_trace_lock.install()
        assert torch.fx.Tracer.trace is dynamos  # switched on again, not wrapped twice
        errors, overlapped = _trace_two_threads()
        assert not overlapped and errors == []
    finally:
        torch.fx.Tracer.trace = before


def test_a_job_that_traces_while_the_program_waits_to_trace_keeps_running(original_call) -> None:
    from aitune_jit import worker

    fx_trace_lock.install()
    seen: list[bool] = []
    go, inside = threading.Event(), threading.Event()

    class Probe(_Paused):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.inside.set()
            seen.append(worker._keeps_running())  # the job's gate asks this at each function start
            self.go.wait(10)
            for _ in range(200):
                if fx_trace_lock._waiting:
                    break
                threading.Event().wait(0.01)
            seen.append(worker._keeps_running())
            return self.lin(x)

    job = threading.Thread(target=torch.fx.symbolic_trace, args=(Probe(go, inside),))
    job.start()
    assert inside.wait(10)
    go.set()
    program = threading.Thread(target=torch.fx.symbolic_trace, args=(torch.nn.Linear(2, 2),))
    program.start()
    job.join(10)
    program.join(10)
    assert seen == [False, True]


def test_a_trace_waits_for_another_threads_dynamo_compile_and_that_compile_does_not_step_aside(original_call) -> None:
    # dynamo's frame compile takes another thread's FX patches off and puts them back when it ends
    # (`_maybe_revert_all_patches`), so a trace must not run inside that window
    import torch._dynamo.convert_frame as convert_frame

    fx_trace_lock.install()
    compiling, release = threading.Event(), threading.Event()
    seen: list[bool] = []

    def job_compile() -> None:
        with convert_frame.compile_lock:  # what dynamo holds for a frame's whole compile
            compiling.set()
            release.wait(10)
            for _ in range(200):
                if fx_trace_lock._waiting:
                    break
                threading.Event().wait(0.01)
            seen.append(fx_trace_lock.others_waiting_here())

    traced = threading.Event()

    def program_trace() -> None:
        torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
        traced.set()

    job = threading.Thread(target=job_compile)
    job.start()
    assert compiling.wait(10)
    program = threading.Thread(target=program_trace)
    program.start()
    assert not traced.wait(0.3)  # the trace waits for the compile
    release.set()
    job.join(10)
    program.join(10)
    assert traced.is_set() and seen == [True]
    assert torch.nn.Module.__call__ is original_call


def test_a_function_compiled_on_another_thread_runs_while_a_program_traces(original_call) -> None:
    # FX's tracing flag is process-wide; a compiled function raised "Detected that you are using FX to
    # symbolically trace a dynamo-optimized function" on any thread while some thread traced
    fx_trace_lock.install()
    go, inside = threading.Event(), threading.Event()
    compiled = torch.compile(lambda x: torch.sin(x) + 1, backend="eager")  # (wrapped after install)
    results: list[object] = []

    def job() -> None:
        try:
            results.append(compiled(torch.zeros(3)))
        except BaseException as exc:  # (collected for the assertion)
            results.append(exc)

    program = threading.Thread(target=torch.fx.symbolic_trace, args=(_Paused(go, inside),))
    program.start()
    assert inside.wait(10)
    assert torch.fx._symbolic_trace.is_fx_symbolic_tracing() is False  # (this thread is not the tracing one)
    worker = threading.Thread(target=job)
    worker.start()
    worker.join(0.3)
    assert results == []  # its compile waits for the program's trace (dynamo's lock)
    go.set()
    program.join(10)
    worker.join(10)
    assert len(results) == 1 and isinstance(results[0], torch.Tensor)
    torch.testing.assert_close(results[0], torch.ones(3))


def test_uninstall_puts_fxs_flag_function_back() -> None:
    original = torch.fx._symbolic_trace.is_fx_symbolic_tracing
    fx_trace_lock.install()
    assert torch.fx._symbolic_trace.is_fx_symbolic_tracing is not original
    fx_trace_lock.uninstall()
    assert torch.fx._symbolic_trace.is_fx_symbolic_tracing is original


def _during_a_trace(traced: torch.nn.Module, go: threading.Event, inside: threading.Event, action) -> object:
    """Run `action()` on this thread while another thread is inside `symbolic_trace(traced)`; its result or error."""
    tracer = threading.Thread(target=torch.fx.symbolic_trace, args=(traced,))
    tracer.start()
    assert inside.wait(10)
    try:
        return action()
    except Exception as exc:  # (returned for the assertion)
        return exc
    finally:
        go.set()
        tracer.join(10)


def test_a_plain_module_call_and_a_parameter_read_on_another_thread_are_plain_during_a_trace(original_call) -> None:
    fx_trace_lock.install()
    go, inside = threading.Event(), threading.Event()
    traced = _Paused(go, inside)
    layer = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    expected = torch.nn.functional.linear(x, layer.weight, layer.bias)

    def action() -> tuple:
        return layer(x), traced.lin.weight  # a call of another module; a parameter of the module being traced

    out, weight = _during_a_trace(traced, go, inside, action)
    torch.testing.assert_close(out, expected)
    assert type(weight) is torch.nn.Parameter and weight is traced.lin._parameters["weight"]


def test_enable_installs_the_lock_before_the_programs_own_compiles_wrap_anything() -> None:
    # a model the program compiled at start-up read FX's process-wide flag and failed while the first job traced
    from aitune_jit.switch import disable, enable

    original = torch.fx._symbolic_trace.is_fx_symbolic_tracing
    enable()
    try:
        assert fx_trace_lock.installed() and torch.fx._symbolic_trace.is_fx_symbolic_tracing is not original
    finally:
        disable()
    assert torch.fx._symbolic_trace.is_fx_symbolic_tracing is original
