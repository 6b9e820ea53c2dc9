"""Tuned behaviour: user hooks, failing backends, threads, shapes outside the tuned range, new graphs, summary."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
import torch
from jit_helpers import (
    CountingBackend,
    FailsAtRunTimeBackend,
    RaisingBackend,
    WrongValuesBackend,
    enable_and_run_mlp,
    make_mlp,
    run,
    states,
)

from aitune_core.backends.compile_regions import MIN_REPEATS
from aitune_core.backends.torch_eager import TorchEagerBackend
from aitune_jit import summary
from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.state import NodeState
from aitune_jit.switch import enable


def _fake_backends(*backends):
    jit_config.backends = list(backends)
    jit_config.detect_graph_breaks = False
    jit_config.min_parameters = 0


def test_user_hooks_still_act_after_tuning():
    """Acceptance 4: a pre-hook that supplies the input and a post-hook that takes argmax."""
    _fake_backends(CountingBackend())
    model = make_mlp()
    supplied: list[torch.Tensor] = []

    def supply_input(module, args):
        if args[0] is None:
            return (supplied[-1],)
        return None

    def take_argmax(module, args, output):
        return output.argmax(dim=-1)

    model.register_forward_pre_hook(supply_input)
    model.register_forward_hook(take_argmax)
    generator = torch.Generator().manual_seed(0)
    enable()
    with torch.no_grad():
        for batch in (2, 6, 3, 5, 4):
            x = torch.randn(batch, 32, generator=generator)
            supplied.append(x)
            result = model(None)
            expected = type(model).forward(model, x).argmax(dim=-1)  # the class's forward, no hooks
            assert result.dtype == torch.int64
            torch.testing.assert_close(result, expected)
    assert PatchedModule.of(model).state is NodeState.TUNED
    assert CountingBackend.builds == 1
    assert CountingBackend.infers >= 3  # the tuned calls (batch 3, 5, 4) went through the backend


@pytest.mark.parametrize(
    ("backend", "cause"),
    [
        (RaisingBackend(), "RaisingBackend refuses to build"),  # fails to build
        (WrongValuesBackend(), "ValidationError"),  # builds, returns wrong values: validation rejects it
    ],
)
def test_failing_backend_leaves_every_module_eager_and_outputs_unchanged(backend, cause):
    """Acceptance 6: the root, then its children, then theirs are tried; all fail; outputs never change."""
    _fake_backends(backend)
    batches = [2, 3, 4, 5, 6, 7]
    model = make_mlp()
    reference = run(make_mlp(), batches)
    enable()
    outputs = run(model, batches)
    for out, ref in zip(outputs, reference):
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
    root = PatchedModule.of(model)
    assert root.state is NodeState.EAGER and cause in root.reason
    assert set(states(model).values()) == {"eager"}  # every level was tried down to max_depth_level
    failures = [h for h in PatchedModule.history if h.startswith("Tuning ") and "failed" in h]
    # identical blocks (and their identical layers) are tried once; the others reuse that failure
    reused = [h for h in PatchedModule.history if "stays eager" in h and "reused the decision of MLP." in h]
    assert len(failures) + len(reused) == len(states(model)) and all(cause in h for h in failures + reused)
    assert reused and len(failures) < len(states(model))


def test_first_working_backend_wins_after_failures():
    _fake_backends(RaisingBackend(), WrongValuesBackend(), CountingBackend())
    model = enable_and_run_mlp([2, 3, 4])
    assert PatchedModule.of(model).backend_names == ["CountingBackend"]


def test_two_threads_during_recording_and_tuning():
    """Acceptance 7: no crash, each module tuned once, correct outputs, nobody blocked by tuning."""
    _fake_backends(CountingBackend())
    CountingBackend.build_delay_s = 0.3  # a slow build: the other thread keeps calling meanwhile
    jit_config.min_samples = 3
    jit_config.retune_after_misses = 0  # one tuning per graph here (re-tuning wider ranges: test_range_growth)
    model = make_mlp()
    reference_model = make_mlp()
    inputs = [torch.randn(b, 32, generator=torch.Generator().manual_seed(b)) for b in range(2, 9)]
    with torch.no_grad():
        expected = [reference_model(x) for x in inputs]
    enable()
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []
    calls_during_build: list[int] = []

    def serve() -> None:
        try:
            barrier.wait()
            with torch.no_grad():
                for _ in range(15):
                    for x, ref in zip(inputs, expected):
                        torch.testing.assert_close(model(x), ref)
                        if CountingBackend.builds and PatchedModule.of(model).state is NodeState.RECORDING:
                            calls_during_build.append(1)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=serve) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert PatchedModule.of(model).state is NodeState.TUNED
    assert CountingBackend.builds == 1  # tuned once, not once per thread
    assert calls_during_build  # the other thread ran (eagerly) while the first one was tuning
    assert sum(h.startswith("Tuning MLP") for h in PatchedModule.history) == 1


def test_shapes_outside_the_tuned_range_run_eagerly_and_warn_once(caplog):
    _fake_backends(CountingBackend())
    model = make_mlp()
    x = torch.randn(16, 32)
    with torch.no_grad():
        expected = model(x)  # before the hook is on
    enable()
    run(model, [2, 4])
    assert PatchedModule.of(model).state is NodeState.TUNED
    infers = CountingBackend.infers
    with caplog.at_level(logging.WARNING, logger="aitune"), torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(model(x), expected)
    assert CountingBackend.infers == infers  # the backend was not used for batch 16
    warnings = [r for r in caplog.records if "outside the tuned range" in r.getMessage()]
    assert len(warnings) == 1
    with torch.no_grad():
        model(torch.randn(3, 32))
    assert CountingBackend.infers == infers + 1  # batch 3 is inside [2, 4]


def test_a_new_graph_after_tuning_is_tuned_when_it_has_enough_samples():
    _fake_backends(CountingBackend())
    model = make_mlp()
    first, second, third = torch.randn(2, 5, 32), torch.randn(3, 5, 32), torch.randn(3, 5, 32)  # rank 3: new graph
    with torch.no_grad():
        expected = [model(first), model(second), model(third)]  # before the hook is on
    enable()
    run(model, [2, 3])
    assert CountingBackend.builds == 1
    with torch.no_grad():
        torch.testing.assert_close(model(first), expected[0])
        assert CountingBackend.builds == 1
        torch.testing.assert_close(model(second), expected[1])  # the second sample: tuned now
        assert CountingBackend.builds == 2
        infers = CountingBackend.infers
        torch.testing.assert_close(model(third), expected[2])
        assert CountingBackend.infers == infers + 1  # served by the new graph's backend
    node = PatchedModule.of(model)
    assert [spec.name for spec, _backend in node._entries] == ["0", "1"]


def test_backend_failing_at_run_time_falls_back_to_eager():
    _fake_backends(FailsAtRunTimeBackend())
    FailsAtRunTimeBackend.fail_after = 10**9
    model = make_mlp()
    x = torch.randn(3, 32)
    with torch.no_grad():
        expected = model(x)  # before the hook is on
    enable()
    run(model, [2, 3])
    assert PatchedModule.of(model).state is NodeState.TUNED
    FailsAtRunTimeBackend.fail_after = 0  # from now on every inference raises
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected)
        torch.testing.assert_close(model(x), expected)
    node = PatchedModule.of(model)
    assert node.state is NodeState.EAGER and "failed at run time" in node.reason
    assert set(states(model).values()) == {"eager", "detached"}  # the subtree stays detached
    lines = summary.summary_lines()  # no longer counted as tuned, only as eager
    assert lines[0].startswith("aitune JIT tuning summary: 0 module(s) tuned"), lines
    assert not any("🎯" in line for line in lines), lines


def test_errors_of_the_users_forward_propagate_unchanged():
    _fake_backends(CountingBackend())
    model = make_mlp()
    enable()
    run(model, [2, 3])
    try:
        with torch.no_grad():
            model(torch.randn(2, 31))  # wrong width: the user's own error
    except RuntimeError as exc:
        assert "31" in str(exc) or "shape" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("expected the forward's error")
    assert PatchedModule.of(model).state is NodeState.TUNED


def test_summary_lines_name_tuned_modules_and_backends():
    _fake_backends(TorchEagerBackend())
    model = make_mlp()
    enable()
    run(model, [2, 3])
    lines = summary.summary_lines()
    assert lines[0].startswith("aitune JIT tuning summary: 1 module(s) tuned")
    assert lines[1] == "  🎯 MLP (MLP 📊2.4K, level 0): TorchEagerBackend() (speed not measured)"


def test_summary_counts_two_tuned_models_of_one_class_twice():
    _fake_backends(CountingBackend())
    first, second = make_mlp(seed=1), make_mlp(seed=2)  # same class: both roots have the path "MLP"
    enable()
    run(first, [2, 3])
    run(second, [2, 3])
    assert PatchedModule.of(first).state is PatchedModule.of(second).state is NodeState.TUNED
    lines = summary.summary_lines()
    assert lines[0].startswith("aitune JIT tuning summary: 2 module(s) tuned"), lines
    tuned = [line for line in lines if "🎯 MLP " in line]
    assert len(tuned) == 1 and tuned[0].endswith("(x2)")  # both counted, one line (see summary.summary_lines)


def test_summary_keeps_a_tuned_node_when_a_later_node_reuses_its_address(monkeypatch):
    """Nodes of modules that died are freed and their address can be reused by a new node: the summary must
    not mistake the new node for the old one (simulated here by an id() that is the same for every node)."""
    monkeypatch.setattr(summary, "id", lambda obj: 0, raising=False)
    _fake_backends(CountingBackend())
    tuned = make_mlp(seed=1)
    enable()
    run(tuned, [2, 3])
    jit_config.backends = [RaisingBackend()]
    failed = make_mlp(seed=2)
    run(failed, [2, 3])
    assert PatchedModule.of(tuned).state is NodeState.TUNED
    assert PatchedModule.of(failed).state is NodeState.EAGER
    lines = summary.summary_lines()
    assert lines[0].startswith("aitune JIT tuning summary: 1 module(s) tuned"), lines


def test_summary_is_logged_once_at_warning(caplog):
    _fake_backends(TorchEagerBackend())
    enable()
    run(make_mlp(), [2, 3])
    with caplog.at_level(logging.WARNING, logger="aitune.jit"):
        summary.log_summary()
    records = [r for r in caplog.records if "JIT tuning summary" in r.getMessage()]
    assert len(records) == 1 and records[0].levelno == logging.WARNING


def test_modules_first_called_by_aitune_itself_go_on_the_fast_path():
    """The backend's wrappers (here the ForwardOnly view the strategy builds on) are never nodes and cost one
    lookup per call once seen, instead of the slow path on every tuned call."""
    from aitune_jit import hook
    from aitune_jit.runtime import PASS

    _fake_backends(CountingBackend())
    model = make_mlp()
    enable()
    run(model, [2, 3])
    node = PatchedModule.of(model)
    assert node.state is NodeState.TUNED
    view = node.backends[0]._module  # what CountingBackend was built with and calls
    assert view.__dict__[hook.NODE_ATTR] is PASS
    assert PatchedModule.of(view) is None


class _Checked(torch.nn.Module):
    """Rejects out-of-range inputs itself, as a model may validate its input inside forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool((x < -100).any()):
            raise ValueError("inputs below -100 are not supported")
        return self.fc(x)


def test_an_error_of_the_users_forward_inside_a_tuned_call_keeps_the_backend():
    _fake_backends(CountingBackend())
    torch.manual_seed(0)
    model = _Checked().eval()
    enable()
    run(model, [2, 3])
    assert PatchedModule.of(model).state is NodeState.TUNED
    with torch.no_grad(), pytest.raises(ValueError, match="below -100") as info:
        model(torch.full((2, 32), -1000.0))  # the backend runs the same forward: it raises, and so does eager
    # the user's error as without aitune (chained to nothing), not a backend failure
    assert info.value.__context__ is None and info.value.__cause__ is None
    assert PatchedModule.of(model).state is NodeState.TUNED  # one bad call does not un-tune the module
    infers = CountingBackend.infers
    with torch.no_grad():
        model(torch.randn(2, 32))
    assert CountingBackend.infers == infers + 1


class _Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor, scale: float = 1.0, request: str = "") -> torch.Tensor:
        return self.fc(x) * scale


def test_a_constant_that_changes_every_call_makes_at_most_max_num_graphs_graphs():
    from aitune_core.config import config

    _fake_backends(CountingBackend())
    torch.manual_seed(0)
    model = _Scaled().eval()
    x = torch.randn(2, 32)
    with torch.no_grad():
        base = model.fc(x)  # before the hook is on
    enable()
    with config.override(max_num_graphs=2), torch.no_grad():
        for i in range(20):
            torch.testing.assert_close(model(x, request=f"id-{i}"), base)
        node = PatchedModule.of(model)
        assert len(node.recorder.graph_specs) == 2 and node.recorder.graphs_refused > 0
        for _ in range(2):  # a value seen before still belongs to its graph, which then gets tuned
            model(x, request="id-1")
    assert node.state is NodeState.TUNED and CountingBackend.builds == 1


def test_a_float_that_changes_every_call_is_one_graph_tuned_once():
    """Free scalars (`aitune_core.specs.free_scalars`): before, each value was a graph and a build of its own."""
    _fake_backends(CountingBackend())
    jit_config.min_samples_varying = 3
    torch.manual_seed(0)
    model = _Scaled().eval()
    x = torch.randn(2, 32)
    with torch.no_grad():
        base = model.fc(x)
    enable()
    with torch.no_grad():
        for i in range(20):
            torch.testing.assert_close(model(x, scale=float(i)), base * float(i))
    node = PatchedModule.of(model)
    assert len(node.recorder.graph_specs) == 1 and node.recorder.graph_specs[0].free_scalars() == ["scale"]
    assert node.state is NodeState.TUNED and CountingBackend.builds == 1
    before = CountingBackend.infers
    with torch.no_grad():
        torch.testing.assert_close(model(x, scale=123.5), base * 123.5)  # a value never seen: the backend answers
    assert CountingBackend.infers == before + 1


class _Tokens(torch.nn.Module):
    """A transformers-style forward: called with keyword tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 32)
        self.fc = torch.nn.Linear(32, 32)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.fc(self.embed(input_ids))
        return hidden if attention_mask is None else hidden * attention_mask.unsqueeze(-1)


def test_keyword_tensor_calls_are_served_by_the_backend_after_tuning():
    _fake_backends(CountingBackend())
    torch.manual_seed(0)
    model = _Tokens().eval()
    calls = [(torch.randint(0, 50, (b, 7)), torch.ones(b, 7)) for b in (2, 4, 3, 3)]
    with torch.no_grad():
        expected = [model(input_ids=ids, attention_mask=mask) for ids, mask in calls]
    enable()
    with torch.no_grad():
        for ids, mask in calls[:2]:
            model(input_ids=ids, attention_mask=mask)
        assert PatchedModule.of(model).state is NodeState.TUNED
        infers = CountingBackend.infers
        torch.testing.assert_close(model(input_ids=calls[2][0], attention_mask=calls[2][1]), expected[2])
        torch.testing.assert_close(model(attention_mask=calls[3][1], input_ids=calls[3][0]), expected[3])
        assert CountingBackend.infers == infers + 2  # both keyword orders went to the backend
        model(input_ids=torch.randint(0, 50, (9, 7)), attention_mask=torch.ones(9, 7))  # batch 9: outside
        assert CountingBackend.infers == infers + 2  # ... so it ran eagerly


class _Repeated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return x + torch.relu(self.fc(x))


class _Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(_Repeated() for _ in range(MIN_REPEATS))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_switching_the_jit_off_gives_a_marked_block_class_back(tmp_path):
    """A root compiled with its repeated blocks as compile regions holds their class's mark; once the JIT is off
    and the tuned backend is gone, the class is as it was."""
    import gc

    from aitune_core.backends.torch_inductor import TorchInductorBackend
    from aitune_core.strategies.one_backend import OneBackendStrategy
    from aitune_jit.switch import disable

    original = _Repeated.__dict__["forward"]
    # (torch 2.13's nested-region compile failed with a KeyError in `invoke_subgraph.stamp_out_subgraph` after the
    # float64 compile of test_jit_follow_model.py in the same process: the backend then compiles without regions,
    # which this test is not about)
    torch._dynamo.reset()
    jit_config.min_parameters = 0
    jit_config.cache_dir = tmp_path
    jit_config.strategy = OneBackendStrategy(TorchInductorBackend())
    model = _Stack().eval()
    enable()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(4, 8))
    assert PatchedModule.of(model).state is NodeState.TUNED, PatchedModule.history
    assert getattr(_Repeated.forward, "__aitune_region__", False)
    assert any(f"identical blocks compiled once per class as nested compile regions ({MIN_REPEATS} _Repeated blocks "
               "in 1 group)" in line for line in PatchedModule.history), PatchedModule.history
    disable()
    gc.collect()
    assert _Repeated.__dict__["forward"] is original


def test_a_replaced_backend_failing_in_a_call_that_was_already_on_its_way_blames_nothing():
    """A re-tune or an upgrade replaces and releases a graph's backend while another thread's call still goes
    through the old dispatcher: that call's failure is answered by the original module and the graph keeps its
    new backend."""
    _fake_backends(CountingBackend())
    model = make_mlp()
    enable()
    run(model, [2, 3])
    node = PatchedModule.of(model)
    old = node._entries[0][1]
    spec = node._entries[0][0]
    fresh = CountingBackend().build(node.tuning_view(), spec, [], torch.device("cpu"), Path("."))
    node._entries = [(spec, fresh)]  # what `_go_tuned` does for a re-tuned graph
    node._backend_failed(old, RuntimeError("released"))
    assert node.state is NodeState.TUNED and node._failed == {} and node._entries == [(spec, fresh)]


def test_a_backend_failing_at_run_time_with_a_page_of_text_is_one_short_warning(monkeypatch, caplog):
    # dynamo's run-time errors carry the user's stack and pages of explanation: all of it went into one WARNING
    import logging

    page = "Unsupported: cannot trace it\n" + '  File "x.py", line 1, in forward\n    y = f(x)\n' * 40
    _fake_backends(FailsAtRunTimeBackend())
    FailsAtRunTimeBackend.fail_after = 10**9
    model = make_mlp()
    enable()
    run(model, [2, 3])
    FailsAtRunTimeBackend.fail_after = 0
    monkeypatch.setattr(FailsAtRunTimeBackend, "_infer", lambda self, *a, **k: (_ for _ in ()).throw(
        RuntimeError(page)))
    with caplog.at_level(logging.WARNING, logger="aitune"), torch.no_grad():
        model(torch.randn(3, 32))
    warnings = [r.getMessage() for r in caplog.records if "failed at run time" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0] and len(warnings[0]) < 800
    assert "cannot trace it" in warnings[0] and 'File "x.py"' not in warnings[0]
