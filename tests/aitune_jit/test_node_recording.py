"""NodeRecording: what a node records, and that a failure while recording never reaches the call."""

from __future__ import annotations

import logging

import torch
from jit_helpers import CountingBackend, make_mlp

from aitune_core.recording.graph_recorder import GraphRecorder
from aitune_jit.config import jit_config
from aitune_jit.node_recording import missing_for_tuning
from aitune_jit.patched_module import PatchedModule
from aitune_jit.state import NodeState
from aitune_jit.switch import disable, enable


def _setup() -> None:
    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False


def test_training_mode_and_gradient_calls_are_not_recorded():
    _setup()
    model = make_mlp()
    enable()
    x = torch.randn(2, 32)
    model.train()
    with torch.no_grad():
        model(x)
    model.eval()
    model(x)  # gradients enabled and trainable parameters: not an inference call
    node = PatchedModule.of(model)
    assert node.state is NodeState.RECORDING and node.recorder.total_calls == 0
    assert any("training mode" in line for line in PatchedModule.history)
    assert any("gradients enabled" in line for line in PatchedModule.history)


def test_a_failure_while_recording_ends_tuning_not_the_call(caplog):
    _setup()
    model = make_mlp()
    enable()
    x = torch.randn(2, 32)
    with torch.no_grad():
        model(x)  # the node exists and records from now on
        node = PatchedModule.of(model)

        def broken(*args, **kwargs):
            raise KeyError("recorder bug")

        node.recorder.record = broken
        with caplog.at_level(logging.INFO, logger="aitune"):
            out = model(x)
    torch.testing.assert_close(out, type(model).forward(model, x))
    assert node.state is NodeState.EAGER and "cannot be recorded (KeyError" in node.reason


def test_a_graph_is_ready_with_min_samples_and_a_batch_axis_where_required():
    layer = torch.nn.Linear(4, 4).eval()
    recorder = GraphRecorder(layer.forward, name="fc")
    jit_config.min_samples = 2
    with torch.no_grad():
        spec = recorder.record((torch.randn(3, 4),), {}, layer(torch.randn(3, 4)))
        assert missing_for_tuning(recorder, spec) == "samples"
        x = torch.randn(3, 4)
        spec = recorder.record((x,), {}, layer(x))
    jit_config.batch_axis_required = True
    assert missing_for_tuning(recorder, spec) == "batch axis"  # the same batch size twice: no axis seen vary
    jit_config.batch_axis_required = False
    assert missing_for_tuning(recorder, spec) is None


def test_a_graph_whose_non_batch_axis_varies_waits_for_min_samples_varying():
    """Varying lengths: the range comes from more calls, so later lengths fall inside it (no second compile)."""
    jit_config.min_samples, jit_config.min_samples_varying = 2, 4
    embed, recorder = _embedding_recorder()
    for length in (40, 90, 70):
        spec = _record_length(embed, recorder, length)
        assert missing_for_tuning(recorder, spec) == "samples"
    # a graph due for a re-tune (its calls counted as misses) or a stateful node's does not wait for more
    assert missing_for_tuning(recorder, spec, varying_waits=False) is None
    spec = _record_length(embed, recorder, 33)
    assert missing_for_tuning(recorder, spec) is None
    assert spec.input_spec.tensors[0].min_shape[1] == 33 and spec.input_spec.tensors[0].max_shape[1] == 90

    batches = GraphRecorder(embed.forward, name="batches")  # only the batch size varies: min_samples is enough
    with torch.no_grad():
        for batch in (2, 5):
            ids = torch.randint(0, 200, (batch, 16))
            spec = batches.record((ids,), {}, embed(ids))
    assert missing_for_tuning(batches, spec) is None


def test_a_graph_with_a_free_scalar_waits_for_min_samples_varying():
    """An int step that changes per call: the warm-up needs a third value to tell a symbolic step from a
    specialized one (`scalar_specialization`)."""
    jit_config.min_samples, jit_config.min_samples_varying = 2, 4
    model = torch.nn.Linear(8, 8).eval()
    recorder = GraphRecorder(lambda x, t: None, name="steps")
    for t in (999, 979, 959):
        spec = recorder.record((torch.randn(2, 8), t), {}, model(torch.randn(2, 8)))
        assert missing_for_tuning(recorder, spec) == "samples"
    assert spec.free_scalars() == ["t"] and len(recorder.graph_specs) == 1
    spec = recorder.record((torch.randn(2, 8), 939), {}, model(torch.randn(2, 8)))
    assert missing_for_tuning(recorder, spec) is None


def _embedding_recorder():
    """An embedding (batch 8, varying length) and a recorder of its calls."""
    embed = torch.nn.Embedding(200, 8).eval()
    return embed, GraphRecorder(embed.forward, name="embed")


def _record_length(embed, recorder, length: int):
    ids = torch.randint(0, 200, (8, length))
    with torch.no_grad():
        return recorder.record((ids,), {}, embed(ids))


class _Counting(torch.nn.Module):
    """A forward that changes its module (a call counter, a step buffer) or draws noise: replays would repeat it."""

    def __init__(self, effect: str) -> None:
        super().__init__()
        self.body = make_mlp()
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))
        self.effect = effect
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.effect == "counter":
            self.calls += 1
        elif self.effect == "buffer":
            self.steps.add_(1)
        elif self.effect == "noise":
            x = x + torch.randn_like(x)
        return self.body(x)


def test_a_forward_that_changes_its_module_is_not_replayed_and_the_program_sees_its_own_state():
    _setup()
    for effect in ("counter", "buffer", "noise"):
        model = _Counting(effect).eval()
        enable()
        torch.manual_seed(0)
        with torch.no_grad():
            for _ in range(6):
                model(torch.randn(2, 32))
        after = torch.rand(1)
        node = PatchedModule.of(model)
        assert node.state is NodeState.EAGER and "replaying its calls for tuning would change" in node.reason, effect
        assert model.calls == (6 if effect == "counter" else 0) and int(model.steps) == (6 if effect == "buffer" else 0)
        if effect == "noise":  # the program's stream is where it would be without aitune
            torch.manual_seed(0)
            for _ in range(6):
                torch.randn(2, 32), torch.randn(2, 32)
            assert torch.equal(after, torch.rand(1))
        assert node.children and all(child.state is not NodeState.EAGER or "replaying" not in (child.reason or "")
                                     for child in node.children), "its children are still candidates"
        disable()


def test_one_call_that_draws_is_not_enough_to_give_up():
    """Another thread of the program may draw at the moment a recorded call runs: a single call proves nothing."""
    _setup()
    model = make_mlp()
    enable()
    with torch.no_grad():
        model(torch.randn(2, 32))  # the node exists and records from now on
        node = PatchedModule.of(model)
        node._effects_changed("draws from torch's random generator")  # as if another thread drew meanwhile
        assert node.state is NodeState.RECORDING
        for _ in range(3):
            model(torch.randn(2, 32))
    assert node.state is NodeState.TUNED


PRINTED_CALLS = 0


class _Chatty(torch.nn.Module):
    """A forward that prints and counts its calls in a global: replays would print and count again."""

    def __init__(self) -> None:
        super().__init__()
        self.body = make_mlp()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        global PRINTED_CALLS
        PRINTED_CALLS += 1
        print("call", PRINTED_CALLS)
        return self.body(x)


def test_a_forward_that_prints_and_counts_in_a_global_is_not_replayed(capsys):
    _setup()
    model = _Chatty().eval()
    enable()
    with torch.no_grad():
        for _ in range(6):
            model(torch.randn(2, 32))
    node = PatchedModule.of(model)
    assert node.state is NodeState.EAGER and "prints or logs" in node.reason
    assert PRINTED_CALLS == 6
    assert capsys.readouterr().out.splitlines() == [f"call {n}" for n in range(1, 7)]
    assert node.children and all(child.state is not NodeState.EAGER for child in node.children)


class _Stepping(torch.nn.Module):
    """Keeps its step count in a dict attribute: the tensor in it is written in place by every call."""

    def __init__(self) -> None:
        super().__init__()
        self.body = make_mlp()
        self.stats = {"steps": torch.zeros(())}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.stats["steps"] += 1
        return self.body(x) * self.stats["steps"]


def test_a_forward_that_keeps_its_state_in_a_dict_attribute_is_not_replayed():
    # a reviewer's script read 520 steps after 10 calls in blocking mode: every replay of tuning stepped again
    _setup()
    torch.manual_seed(0)
    model, plain = _Stepping().eval(), _Stepping().eval()
    plain.load_state_dict(model.state_dict())
    enable()
    inputs = [torch.randn(2, 32) for _ in range(10)]
    with torch.no_grad():
        outputs = [model(x) for x in inputs]
    node = PatchedModule.of(model)
    assert node.state is NodeState.EAGER and "its attribute `stats`" in node.reason, node.reason
    disable()
    with torch.no_grad():
        expected = [plain(x) for x in inputs]
    assert float(model.stats["steps"]) == 10.0
    for got, want in zip(outputs, expected):
        torch.testing.assert_close(got, want)


def test_a_model_unfrozen_after_tuning_runs_its_grad_calls_eagerly():
    # a frozen backbone was tuned; after requires_grad_(True) its grad-enabled calls still went to the compiled
    # backend (the parameters were checked once, when the module was adopted)
    _setup()
    CountingBackend.reset_counts()
    model = make_mlp().eval().requires_grad_(False)
    enable()
    with torch.no_grad():
        for _ in range(4):
            model(torch.randn(2, 32))
    node = PatchedModule.of(model)
    assert node.state is NodeState.TUNED
    model(torch.randn(2, 32))  # gradients enabled, nothing trainable: an inference call, dispatched
    dispatched = CountingBackend.infers
    assert dispatched > 0
    model.requires_grad_(True)
    out = model(torch.randn(2, 32))
    assert CountingBackend.infers == dispatched and out.grad_fn is not None
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    disable()


def test_recorded_calls_that_fail_on_the_module_now_are_told_from_an_aitune_failure():
    # a model converted with .double() while its job was queued failed the job with a dtype error: that is the
    # program's change (the node records again), not an aitune bug (one WARNING and the root eager for good)
    _setup()
    jit_config.min_samples = 50  # (nothing is tuned here: only the recorded calls matter)
    model = make_mlp().eval()
    enable()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(2, 32))
    node = PatchedModule.of(model)
    assert node.state is NodeState.RECORDING and not node._recorded_calls_fail()
    model.double()
    assert node._recorded_calls_fail()
    node._record_again("its recorded calls fail on it now (RuntimeError: dtype)")
    assert node.state is NodeState.RECORDING and node.recorder.total_calls == 0
    disable()


def test_calls_under_a_torch_func_transform_are_neither_recorded_nor_dispatched():
    # recorded, the per-example shapes of a vmap became samples and widened the ranges, and the re-tune that
    # followed ran inside the program's vmap call (blocking), where a compiled function cannot run
    _setup()
    CountingBackend.reset_counts()
    model = make_mlp().eval()
    enable()
    xs = torch.randn(5, 2, 32)
    with torch.no_grad():
        batched = torch.func.vmap(model)(xs)
    node = PatchedModule.of(model)
    assert node.state is NodeState.RECORDING and node.recorder.total_calls == 0
    assert any("torch.func transform" in line for line in PatchedModule.history)
    with torch.no_grad():
        for _ in range(4):
            model(torch.randn(2, 32))
        assert node.state is NodeState.TUNED
        dispatched = CountingBackend.infers
        again = torch.func.vmap(model)(xs)
        jacobian = torch.func.jacrev(model)(torch.randn(32))
    assert CountingBackend.infers == dispatched  # the original module answered under the transforms
    torch.testing.assert_close(again, batched)
    assert jacobian.shape == (4, 32)
    disable()


def test_calls_through_functional_call_are_neither_recorded_nor_dispatched():
    # recorded, their outputs came from the call's weights; in blocking mode a BERT called this way now and then
    # was tuned again after eight misses and that tuning failed validation: eager for good
    _setup()
    CountingBackend.reset_counts()
    model, other = make_mlp().eval(), make_mlp().eval()
    params = dict(other.named_parameters())
    enable()
    x = torch.randn(2, 32)
    with torch.no_grad():
        swapped = torch.func.functional_call(model, params, (x,))
        node = PatchedModule.of(model)
        assert node.recorder.total_calls == 0
        for _ in range(4):
            model(torch.randn(2, 32))
        assert node.state is NodeState.TUNED
        dispatched = CountingBackend.infers
        again = torch.func.functional_call(model, params, (x,))
        own = model(x)
    assert CountingBackend.infers == dispatched + 1  # only the plain call went to the backend
    torch.testing.assert_close(again, swapped)
    torch.testing.assert_close(swapped, _plain(other, x))
    torch.testing.assert_close(own, _plain(model, x))
    assert any("functional_call" in line for line in PatchedModule.history)
    disable()


def _plain(module, x):
    from aitune_jit.runtime import bypassed

    with bypassed(), torch.no_grad():
        return module(x)
