import logging

import pytest
import torch
from core_fakes import GoodBackend, TinyMLP, record

from aitune_core.backends.dispatcher import NESTED_FX_TRACE_REFUSAL, GraphDispatcher


def _setup(tmp_path):
    model = TinyMLP().eval()
    spec, data = record(model, batch_sizes=(2, 4))
    backend = GoodBackend().build(model, spec, data, torch.device("cpu"), tmp_path)
    calls = {"backend": 0, "fallback": 0}
    original = backend._infer

    def counting_infer(*args, **kwargs):
        calls["backend"] += 1
        return original(*args, **kwargs)

    backend._infer = counting_infer

    def fallback(*args, **kwargs):
        calls["fallback"] += 1
        return model(*args, **kwargs)

    return model, spec, backend, fallback, calls


def test_routes_calls_inside_the_range_to_the_backend(tmp_path, caplog):
    model, spec, backend, fallback, calls = _setup(tmp_path)
    dispatcher = GraphDispatcher([(spec, backend)], fallback, "mlp")
    with caplog.at_level(logging.WARNING, logger="aitune"):
        for batch in (2, 3, 4):
            x = torch.randn(batch, 8)
            assert torch.equal(dispatcher(x), model(x))
    assert calls == {"backend": 3, "fallback": 0}
    assert not caplog.records
    assert dispatcher.backend_for((torch.randn(3, 8),), {}) is backend


def test_fallback_warns_once_per_module_with_shapes(tmp_path, caplog):
    model, spec, backend, fallback, calls = _setup(tmp_path)
    dispatcher = GraphDispatcher([(spec, backend)], fallback, "mlp")
    with caplog.at_level(logging.WARNING, logger="aitune"):
        for batch in (8, 16, 32):  # outside the tuned batch range: same reason, different shapes
            x = torch.randn(batch, 8)
            assert torch.equal(dispatcher(x), model(x))
    assert calls == {"backend": 0, "fallback": 3}
    assert dispatcher.misses == 3
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "`mlp`" in message and "[8, 8]" in message and "[2, 8]..[4, 8]" in message

    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="aitune"):
        dispatcher(torch.randn(3, 8, dtype=torch.float64).float().unsqueeze(0))  # other rank: a new reason
        dispatcher(torch.randn(2, 3, 8))
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]  # (a *args forward warned per call form)
    assert len([r for r in caplog.records if "does not match" in r.getMessage()]) == 1  # at DEBUG, once
    assert calls["fallback"] == 5


def test_several_graphs(tmp_path):
    model, spec, backend, fallback, calls = _setup(tmp_path)
    other_model = TinyMLP(features=6).eval()
    other_spec, other_data = record(other_model, batch_sizes=(1, 2), features=6)
    other = GoodBackend().build(model, other_spec, other_data, torch.device("cpu"), tmp_path)
    dispatcher = GraphDispatcher([(other_spec, other), (spec, backend)], fallback, "mlp")
    assert dispatcher.backend_for((torch.randn(3, 8),), {}) is backend
    assert dispatcher.backend_for((torch.randn(1, 6),), {}) is other
    assert dispatcher.backend_for((torch.randn(9, 8),), {}) is None
    dispatcher(torch.randn(3, 8))
    assert calls["backend"] == 1


def test_backend_errors_go_to_the_handler_and_fallback_errors_to_the_caller(tmp_path):
    import pytest

    model, spec, backend, fallback, _calls = _setup(tmp_path)

    def broken(*args, **kwargs):
        raise RuntimeError("engine lost")

    backend._infer = broken
    seen = []

    def handler(failed, exc):  # the policy only: the dispatcher answered the call with the original forward
        seen.append((failed, str(exc)))

    x = torch.randn(3, 8)
    with pytest.raises(RuntimeError, match="engine lost"):  # no handler: the backend's error propagates
        GraphDispatcher([(spec, backend)], fallback, "mlp")(x)
    dispatcher = GraphDispatcher([(spec, backend)], fallback, "mlp", on_backend_error=handler)
    assert torch.equal(dispatcher(x), model(x))
    assert seen == [(backend, "engine lost")]
    with pytest.raises(RuntimeError):  # a call outside the graphs runs the fallback, whose error is the caller's
        dispatcher(torch.randn(3, 5))
    assert len(seen) == 1


def _watched(tmp_path, bakes: bool, refit_ok: bool):
    from aitune_core.backends.module_watch import ModuleWatch

    model, spec, backend, fallback, calls = _setup(tmp_path)
    backend.__class__ = type("Watched", (type(backend),), {"bakes_weights": property(lambda self: bakes)})
    calls["original"] = 0
    calls["refit"] = 0

    def original(*args, **kwargs):
        calls["original"] += 1
        return model(*args, **kwargs)

    def refit(_backend):
        calls["refit"] += 1
        return refit_ok

    dispatcher = GraphDispatcher([(spec, backend)], fallback, "mlp", watch=ModuleWatch(model, [backend]),
                                 original=original, refit=refit)
    return model, dispatcher, calls


def test_a_hook_on_a_submodule_sends_calls_to_the_original_not_to_the_recording_fallback(tmp_path):
    model, dispatcher, calls = _watched(tmp_path, bakes=False, refit_ok=True)
    child = next(m for m in model.modules() if m is not model)
    handle = child.register_forward_hook(lambda *a: None)
    x = torch.randn(3, 8)
    assert torch.equal(dispatcher(x), model(x)) and torch.equal(dispatcher(x), model(x))
    assert calls["original"] == 2 and calls["backend"] == 0 and calls["fallback"] == 0
    handle.remove()
    dispatcher(x)
    assert calls["backend"] == 1 and calls["refit"] == 0


def test_a_baked_backend_answers_only_once_refit(tmp_path):
    model, dispatcher, calls = _watched(tmp_path, bakes=True, refit_ok=False)
    with torch.no_grad():
        next(model.parameters()).add_(1)
    x = torch.randn(3, 8)
    dispatcher(x)
    dispatcher(x)
    assert calls["original"] == 2 and calls["backend"] == 0 and calls["refit"] == 1  # retried on the next change
    model2, dispatcher2, calls2 = _watched(tmp_path, bakes=True, refit_ok=True)
    with torch.no_grad():
        next(model2.parameters()).add_(1)
    dispatcher2(x)
    assert calls2["backend"] == 1 and calls2["refit"] == 1 and calls2["original"] == 0


def test_while_one_thread_refits_the_others_are_answered_by_the_original(tmp_path):
    import threading

    from aitune_core.backends.module_watch import ModuleWatch

    model, spec, backend, fallback, calls = _setup(tmp_path)
    backend.__class__ = type("Baking", (type(backend),), {"bakes_weights": property(lambda self: True)})
    started, release = threading.Event(), threading.Event()
    calls["original"] = 0

    def original(*args, **kwargs):
        calls["original"] += 1
        return model(*args, **kwargs)

    def slow_refit(_backend):
        started.set()
        assert release.wait(10)
        return True

    dispatcher = GraphDispatcher([(spec, backend)], fallback, "mlp", watch=ModuleWatch(model, [backend]),
                                 original=original, refit=slow_refit)
    with torch.no_grad():
        next(model.parameters()).add_(1)
    x = torch.randn(3, 8)
    refitting = threading.Thread(target=dispatcher, args=(x,))
    refitting.start()
    assert started.wait(10)
    assert torch.equal(dispatcher(x), model(x))  # this thread does not wait for the refit
    assert calls["original"] == 1 and calls["backend"] == 0
    release.set()
    refitting.join(10)
    dispatcher(x)
    assert calls["backend"] == 2  # the refitting thread's call and this one


def test_when_the_original_forward_fails_too_the_users_error_propagates_and_the_backend_is_not_blamed(tmp_path):
    import pytest

    _model, spec, backend, _fallback, _calls = _setup(tmp_path)

    def broken(*args, **kwargs):
        raise RuntimeError("engine lost")

    def original(x):
        try:
            x[99]
        except IndexError as e:
            raise ValueError("the user's own check") from e

    backend._infer = broken
    blamed = []
    dispatcher = GraphDispatcher([(spec, backend)], original, "m", on_backend_error=lambda b, exc: blamed.append(exc))
    with pytest.raises(ValueError, match="the user's own check") as info:
        dispatcher(torch.randn(3, 8))
    assert blamed == []
    # chained as in a plain run: the user's own cause, and no aitune error anywhere in the chain (a `from None`
    # wiped the user's `__cause__`)
    cause = info.value.__cause__
    assert isinstance(cause, IndexError) and info.value.__context__ is cause
    assert cause.__context__ is None and cause.__cause__ is None


def test_a_compiled_backend_refusing_while_fx_traces_elsewhere_is_answered_by_the_original_and_kept(tmp_path):
    """torch's FX-tracing flag is process-wide: while the background worker traces, a compiled call is refused by
    dynamo or recompiles into FX's patch. The dispatcher sends such calls to the original forward without calling
    the backend; the backend is not blamed and serves again after."""
    import torch.fx._symbolic_trace as fx_trace

    model, spec, backend, fallback, _calls = _setup(tmp_path)
    compiled = torch.compile(model, backend="eager")  # a real dynamo-optimized function, with torch's real check
    served = []

    def infer(*args, **kwargs):
        served.append(1)
        return compiled(*args, **kwargs)

    backend._infer = infer
    blamed = []
    dispatcher = GraphDispatcher([(spec, backend)], fallback, "mlp", on_backend_error=lambda b, e: blamed.append(e))
    x = torch.randn(3, 8)
    saved = fx_trace._is_fx_tracing_flag
    fx_trace._is_fx_tracing_flag = True  # what another thread's `Tracer.trace` sets while it runs
    try:
        torch.testing.assert_close(dispatcher(x), model(x))
    finally:
        fx_trace._is_fx_tracing_flag = saved
    assert blamed == [] and served == []
    torch.testing.assert_close(dispatcher(x), model(x))  # the flag is down: the backend answers again
    assert blamed == [] and len(served) == 1
    backend._infer = lambda *a, **k: (_ for _ in ()).throw(RuntimeError(NESTED_FX_TRACE_REFUSAL))
    torch.testing.assert_close(dispatcher(x), model(x))  # the refusal itself (a trace that began mid-call)
    assert blamed == []


def test_dynamo_tracing_into_another_threads_fx_patch_is_not_the_backends_fault(tmp_path):
    """While another thread's make_fx or torch.export patches `torch.nn.Module.__call__`, a compiled backend that
    recompiles for a call traces into FX's wrapper and fails (dynamo names FX's file in its error): the original
    answers, the backend is kept. A failure of the backend's own is still blamed."""
    model, spec, backend, fallback, _calls = _setup(tmp_path)
    errors = [RuntimeError('higher order op ... File "/x/torch/fx/_symbolic_trace.py", line 859, in module_call')]

    def infer(*args, **kwargs):
        raise errors[0]

    backend._infer = infer
    blamed = []
    dispatcher = GraphDispatcher([(spec, backend)], fallback, "mlp", on_backend_error=lambda b, e: blamed.append(e))
    x = torch.randn(3, 8)
    torch.testing.assert_close(dispatcher(x), model(x))
    assert blamed == []
    errors[0] = RuntimeError("the backend's own failure")
    torch.testing.assert_close(dispatcher(x), model(x))
    assert len(blamed) == 1


def test_while_the_pause_is_held_every_call_is_the_originals(tmp_path):
    from aitune_core.backends.dispatch_pause import original_forwards_only

    model, spec, backend, fallback, _calls = _setup(tmp_path)
    served = []
    backend._infer = lambda *a, **k: served.append(1) or model(*a, **k)
    dispatcher = GraphDispatcher([(spec, backend)], fallback, "mlp")
    x = torch.randn(3, 8)
    with original_forwards_only():
        torch.testing.assert_close(dispatcher(x), model(x))
    assert served == []
    dispatcher(x)
    assert served == [1]


def test_a_call_inside_vmap_that_the_backend_cannot_run_blames_nothing(tmp_path):
    """torch runs no compiled function under a `torch.func` transform: such a call is the original forward's, and
    the backend keeps serving plain calls (before, one `torch.vmap(model)` sent the module to eager for good)."""
    model, spec, backend, fallback, _calls = _setup(tmp_path)

    def refuse(*args, **kwargs):
        raise RuntimeError("torch.func.vmap of a compiled function is not supported")

    backend._infer = refuse
    blamed = []
    dispatcher = GraphDispatcher([(spec, backend)], fallback, "mlp", on_backend_error=lambda b, e: blamed.append(e))
    batches = torch.randn(3, 4, 8)
    with torch.no_grad():
        torch.testing.assert_close(torch.vmap(dispatcher)(batches), torch.vmap(model)(batches))
        assert blamed == []
        dispatcher(torch.randn(4, 8))  # outside a transform the same failure is the backend's
    assert len(blamed) == 1


def test_a_new_structure_goes_to_the_original_and_its_owner_is_told_until_it_takes_the_news(tmp_path):
    from aitune_core.backends.module_watch import ModuleWatch

    model, spec, backend, fallback, calls = _setup(tmp_path)
    answers = [False, True]
    told: list[str] = []

    def on_outdated(what: str) -> bool:
        told.append(what)
        return answers.pop(0)

    def original(*args, **kwargs):
        calls["original"] = calls.get("original", 0) + 1
        return model(*args, **kwargs)

    dispatcher = GraphDispatcher([(spec, backend)], fallback, "mlp", watch=ModuleWatch(model, [backend]),
                                 original=original, on_outdated=on_outdated)
    model.act = torch.nn.GELU()  # (the backend runs the module: a compiled one would recompile here)
    x = torch.randn(3, 8)
    assert torch.equal(dispatcher(x), model(x))
    assert torch.equal(dispatcher(x), model(x))
    assert told == ["a submodule changed class (act: ReLU -> GELU)"] * 2  # asked again until it said True
    assert calls["original"] == 2 and calls["backend"] == 0 and calls["fallback"] == 0


def test_a_backend_answering_with_the_plain_code_is_served_and_its_owner_told_of_each_such_call(tmp_path):
    from aitune_core.errors import CompiledCodeMissed

    model, spec, backend, fallback, calls = _setup(tmp_path)

    def missing(*args, **kwargs):  # what a compiled backend's `serve` does when its guards fail
        raise CompiledCodeMissed(model(*args, **kwargs))

    backend.serve = missing
    told: list[str] = []
    answers = [True, True, False]
    x = torch.randn(3, 8)

    def owner(graph: str) -> bool:
        told.append(graph)
        return answers.pop(0)

    owned = GraphDispatcher([(spec, backend)], fallback, "mlp", on_code_missed=owner)
    for _ in range(3):
        assert torch.equal(owned(x), model(x))
    assert told == [spec.name] * 3 and owned.code_misses == 3 and calls == {"backend": 0, "fallback": 0}
    assert torch.equal(owned(x), model(x))  # the owner said False: the backend compiles in the call (`infer`)
    assert calls["backend"] == 1 and owned.code_misses == 3
    alone = GraphDispatcher([(spec, backend)], fallback, "solo")  # no owner: `infer`, as before
    assert torch.equal(alone(x), model(x)) and calls["backend"] == 2 and alone.code_misses == 0


def test_a_plain_run_that_raises_is_the_users_error_and_runs_once(tmp_path):
    from aitune_core.errors import CompiledCodeMissed

    model, spec, backend, fallback, _calls = _setup(tmp_path)
    runs: list[str] = []

    def plain_fails(*args, **kwargs):  # the plain forward ran (a miss) and raised the user's own error
        runs.append("plain")
        raise CompiledCodeMissed(None, error=ValueError("bad request"))

    def original(*args, **kwargs):
        runs.append("original")
        return model(*args, **kwargs)

    backend.serve = plain_fails
    blamed: list[object] = []
    dispatcher = GraphDispatcher([(spec, backend)], fallback, "mlp", on_code_missed=lambda graph: True,
                                 on_backend_error=lambda b, e: blamed.append(e), original=original)
    with pytest.raises(ValueError, match="bad request") as raised:
        dispatcher(torch.randn(3, 8))
    assert runs == ["plain"] and blamed == [] and raised.value.__context__ is None


class _Cache:
    """An object argument, compared by its layout (`object_signature`)."""

    def __init__(self, n: int) -> None:
        self.layers = [torch.zeros(2) for _ in range(n)]


class _WithCache(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, cache: _Cache) -> torch.Tensor:
        return self.fc(x) + len(cache.layers)


def test_object_layouts_are_walked_only_where_the_tensors_leave_a_choice(tmp_path, monkeypatch):
    """A decoding step passes its KV cache: walking its layout every call cost about 65 us a step. A backend that
    checks that layout itself (dynamo's guards) is chosen without the walk where it is the only candidate left."""
    from aitune_core.backends import torch_eager
    from aitune_core.recording.graph_recorder import GraphRecorder
    from aitune_core.specs import sample_metadata

    model = _WithCache().eval()
    recorder = GraphRecorder(model)
    with torch.no_grad():
        for batch, n in ((2, 3), (4, 3), (2, 5), (4, 5)):
            x, cache = torch.randn(batch, 8), _Cache(n)
            recorder.record((x, cache), {}, model(x, cache))
    three, five = recorder.graph_specs  # one graph per cache layout
    walks = []
    signature = sample_metadata.object_signature
    monkeypatch.setattr(sample_metadata, "object_signature", lambda v: walks.append(1) or signature(v))

    def backend(spec):
        built = torch_eager.TorchEagerBackend().build(model, spec, recorder.samples(spec), torch.device("cpu"),
                                                      tmp_path)
        assert built.checks_object_layouts
        return built

    single = GraphDispatcher([(three, backend(three))], model, "m")
    with torch.no_grad():
        single(torch.randn(3, 8), _Cache(3))
        assert walks == []  # its only graph, and its backend checks the layout
        single.lazy_objects = False  # (as after a call that missed the compiled code)
        single(torch.randn(3, 8), _Cache(3))
        assert len(walks) == 1
        walks.clear()
        both = GraphDispatcher([(three, backend(three)), (five, backend(five))], model, "m")
        x = torch.randn(3, 8)
        assert torch.equal(both(x, _Cache(5)), model(x, _Cache(5)))  # the layout decides
        assert both.backend_for((x, _Cache(5)), {}) is both.entries[1][1] and walks
