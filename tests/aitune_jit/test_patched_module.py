"""PatchedModule: what a recording or tuned module's forward does for calls that are not the program's own."""

from __future__ import annotations

import warnings

import pytest
import torch
from jit_helpers import CountingBackend, make_mlp, run

from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.state import NodeState
from aitune_jit.switch import enable


def test_torch_jit_trace_of_a_tuned_module_records_the_original_forward() -> None:
    # the tuned call's shape check ran on traced sizes: a TracerWarning (a SystemError under "error"), and the
    # backend was dropped for good as failed at run time
    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False
    jit_config.min_parameters = 0
    jit_config.min_samples = 2
    model = make_mlp()
    enable()
    run(model, [1, 2, 1, 2])
    node = PatchedModule.of(model)
    assert node.state is NodeState.TUNED
    infers = CountingBackend.infers
    x = torch.randn(2, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.jit.TracerWarning)
        traced = torch.jit.trace(model, (x,), check_trace=False)  # (its check calls the model again, untraced)
    assert CountingBackend.infers == infers  # the trace ran the original forward, not the backend
    with torch.no_grad():
        torch.testing.assert_close(traced(x), model(x))
    assert node.state is NodeState.TUNED and CountingBackend.infers > infers  # still tuned, still served


def _tuned_model(cls: type[torch.nn.Module]) -> tuple[torch.nn.Module, PatchedModule]:
    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False
    jit_config.min_parameters = 0
    jit_config.min_samples = 2
    torch.manual_seed(0)
    model = cls().eval()
    enable()
    run(model, [1, 2, 1, 2])
    node = PatchedModule.of(model)
    assert node.state is NodeState.TUNED
    return model, node


def test_a_class_level_forward_patch_after_tuning_runs_the_new_forward(caplog) -> None:
    from jit_helpers import MLP

    class Patched(MLP):
        pass

    model, node = _tuned_model(Patched)
    Patched.forward = lambda self, x: self.head(x * 0 + 1)  # a monkeypatch the program applies mid-run
    x = torch.randn(2, 32)
    with torch.no_grad(), caplog.at_level("WARNING", logger="aitune"):
        outputs = [model(x) for _ in range(3)]
    for out in outputs:
        torch.testing.assert_close(out, model.head(torch.ones(2, 32)))
    assert node.state is NodeState.EAGER and "forward" not in model.__dict__
    assert "Patched.forward was replaced" in node.reason
    assert sum("forward changed" in record.getMessage() for record in caplog.records) == 1


def test_a_class_swap_while_recording_runs_the_new_class_and_a_late_outcome_is_dropped(monkeypatch) -> None:
    from jit_helpers import MLP, recording_mlp

    from aitune_jit.outcome import TuningOutcome

    model, node = recording_mlp(min_samples=50)

    class Shifted(MLP):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) - 5

    model.__class__ = Shifted
    x = torch.randn(3, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), MLP.forward(model, x) - 5)
    assert node.state is NodeState.EAGER and "class changed from MLP to" in node.reason
    late = TuningOutcome.tuned([(object(), CountingBackend())], [])  # a job's outcome for the old forward
    released = []
    monkeypatch.setattr(TuningOutcome, "release_backends", lambda self: released.append(self))
    node.apply(late)
    assert node.state is NodeState.EAGER and released == [late]


def test_a_tuned_model_under_fake_tensor_mode_runs_its_own_forward() -> None:
    # a shape or memory estimator: the compiled backend was handed fake tensors and the process died (SIGSEGV)
    from jit_helpers import MLP
    from torch._subclasses.fake_tensor import FakeTensorMode

    model, node = _tuned_model(MLP)
    infers = CountingBackend.infers
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True) as mode:
        out = model(mode.from_tensor(torch.randn(5, 32)))
    assert type(out).__name__ == "FakeTensor" and tuple(out.shape) == (5, 4)
    assert CountingBackend.infers == infers and node.state is NodeState.TUNED


def test_torch_jit_script_of_a_tuned_model_compiles_the_users_forwards() -> None:
    from jit_helpers import MLP

    model, node = _tuned_model(MLP)
    scripted = torch.jit.script(model)
    x = torch.randn(3, 32)
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), MLP.forward(model, x))
    assert "forward" in model.__dict__ and node.state is NodeState.TUNED  # routing is back


def test_a_submodule_wrapped_by_aitune_torch_module_is_left_to_it() -> None:
    # the JIT wrapped the AOT wrapper's slot in its own, and aitune.torch.save found no aitune Module
    import pytest
    from jit_helpers import MLP

    from aitune_aot.module import Module, find_wrapper

    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False
    jit_config.min_parameters = 0
    jit_config.min_samples = 2
    jit_config.skip_modules = ["MLP", "Sequential"]  # the blocks are the candidates
    model = MLP().eval()
    raw = model.blocks[0]
    model.blocks[0] = wrapper = Module(raw, "first_block")
    enable()
    run(model, [1, 2, 1, 2])
    node = PatchedModule.of(raw)
    assert node.state is NodeState.SKIPPED and not node.descend and "aitune.torch.Module" in node.reason
    assert find_wrapper(raw) is wrapper and PatchedModule.of(model.blocks[1]).state is NodeState.TUNED
    other = MLP().eval()
    run(other, [1, 2])  # the JIT records its blocks now: wrapping one is refused with the reason
    with pytest.raises(ValueError, match="aitune's JIT tuning"):
        Module(other.blocks[0], "late")


def test_a_librarys_routine_class_swap_sends_the_node_eager_without_a_warning(caplog) -> None:
    # torch.nn.utils.parametrize swaps a module's class for a subclass with the same forward: correct to stop
    # routing (the structure changed), but no news to the user
    from jit_helpers import MLP

    class Tunable(MLP):
        pass

    class ParametrizedTunable(Tunable):  # what parametrize makes: a subclass, forward untouched
        pass

    model, node = _tuned_model(Tunable)
    model.__class__ = ParametrizedTunable
    x = torch.randn(2, 32)
    with torch.no_grad(), caplog.at_level("INFO", logger="aitune"):
        torch.testing.assert_close(model(x), MLP.forward(model, x))
    changed = [r for r in caplog.records if "forward changed" in r.getMessage()]
    assert node.state is NodeState.EAGER and len(changed) == 1 and changed[0].levelname == "INFO"
    assert "a subclass with the same forward" in changed[0].getMessage()


def test_a_forward_the_program_kept_still_answers_after_jit_tuning_is_switched_off() -> None:
    # a callback holding `m.forward` (or a wrapper calling it) raised "'NoneType' object is not callable" after
    # disable(): the released node was still TUNED, without a dispatcher
    from aitune_jit.switch import disable

    model, _node = _tuned_model(lambda: make_mlp())
    kept = model.forward
    x = torch.randn(2, 32)
    with torch.no_grad():
        want = model(x)
        disable()
        torch.testing.assert_close(kept(x), want)
        torch.testing.assert_close(model(x), want)


def test_a_call_interrupted_on_its_way_in_leaves_no_request_counted_and_no_stack_entry(monkeypatch):
    """A signal handler may raise between any two steps of the call path; the request count and the call stack
    must come back as they were (a request left counted makes a background job wait on it for good)."""
    from aitune_jit import patched_module, worker_yield
    from aitune_jit.runtime import tls

    jit_config.backends = [CountingBackend()]
    jit_config.min_parameters = 0
    model = make_mlp()
    enable()
    started = patched_module.request_started

    def interrupted() -> None:
        started()
        raise TimeoutError  # (the handler's exception, right after the count)

    monkeypatch.setattr(patched_module, "request_started", interrupted)
    with torch.no_grad(), pytest.raises(TimeoutError):
        model(torch.randn(2, 8))
    assert worker_yield.requests_in_flight() == 0 and not tls.stack


def test_a_call_no_tuned_graph_accepts_warns_from_torchs_line_as_plainly() -> None:
    # a forward's stacklevel=2 warning named aitune's patched_module.py for calls the dispatcher sent to the
    # original forward (a helper's script, sixth round: a deprecated argument given after tuning)
    import inspect

    from jit_helpers import MLP

    class Deprecating(MLP):
        def forward(self, x: torch.Tensor, old: object = None) -> torch.Tensor:
            if old is not None:
                warnings.warn("`old` is deprecated", FutureWarning, stacklevel=2)
            return super().forward(x)

    model, node = _tuned_model(Deprecating)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        model(torch.randn(2, 32), old=1)  # (a new argument structure: no tuned graph accepts it; recorded)
        node._not_replayable("it prints")  # (as after a call that printed: a tuned node then records no new graphs)
        model(torch.randn(2, 32), old=2)
    places = {(w.filename, w.lineno) for w in caught if "deprecated" in str(w.message)}
    assert places and all(f == inspect.getsourcefile(torch.nn.Module._call_impl) for f, _ in places), places
    assert node.state is NodeState.TUNED
