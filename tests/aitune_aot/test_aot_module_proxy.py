"""The Module proxy: transparency, state transitions, recording."""

import pytest
import torch
from aot_models import MLP, build

import aitune_aot.module as aot_module
import aitune_aot.strategy_choice as strategy_choice
from aitune_aot.module import Module, ModuleState, find_wrapper
from aitune_aot.registry import MODULE_REGISTRY
from aitune_core.context import BATCH_SIZE_KEY, global_context


def test_attribute_access_isinstance_and_repr():
    raw = MLP()
    wrapped = Module(raw, "enc")
    assert isinstance(wrapped, MLP) and isinstance(wrapped, torch.nn.Module) and isinstance(wrapped, Module)
    assert wrapped.fc1 is raw.fc1 and wrapped.training is raw.training
    assert wrapped.__wrapped__ is raw
    wrapped.custom = 3  # attribute writes reach the wrapped module
    assert raw.custom == 3
    assert wrapped.name == "enc" and wrapped.state is ModuleState.INIT and wrapped.device == torch.device("cpu")
    assert "enc" in repr(wrapped) and "Linear" in repr(wrapped)
    assert find_wrapper(raw) is wrapped and find_wrapper(wrapped) is wrapped


def test_getitem_on_sequential_and_chainable_methods_return_the_wrapper():
    seq = Module(torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU()))
    assert isinstance(seq[0], torch.nn.Linear) and len(seq) == 2
    assert seq.eval() is seq and seq.to("cpu") is seq and seq.float() is seq
    assert seq.training is False


def test_parent_state_dict_and_load_state_dict_are_unchanged_by_wrapping():
    model = build()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    model.encoder = Module(model.encoder, "enc")
    assert isinstance(model._modules["encoder"], Module)
    state = model.state_dict()
    assert list(state) == list(expected)
    assert all(torch.equal(state[k], expected[k]) for k in expected)
    other = build(seed=1)
    other.encoder = Module(other.encoder, "enc2")
    other.load_state_dict(state)
    assert torch.equal(other.encoder.fc1.weight, model.encoder.fc1.weight)


def test_passthrough_is_identical_and_hooks_fire():
    raw = MLP()
    x = torch.randn(3, 8)
    expected = raw(x)
    calls = []
    raw.register_forward_pre_hook(lambda m, args: calls.append("pre"))
    raw.register_forward_hook(lambda m, args, out: calls.append("post"))
    wrapped = Module(raw)
    assert torch.equal(wrapped(x), expected)
    wrapped.enable_passthrough()
    assert torch.equal(wrapped(x, scale=2.0), expected * 2.0)
    assert calls == ["pre", "post"] * 2


def test_default_names_are_unique_and_sanitized():
    a, b = Module(MLP()), Module(MLP())
    c = Module(MLP(), "my model/v1")
    assert (a.name, b.name, c.name) == ("MLP", "MLP_1", "my_model_v1")
    assert MODULE_REGISTRY.modules() == [a, b, c]


def test_wrapping_twice_or_wrapping_a_non_module_fails():
    raw = MLP()
    wrapped = Module(raw, "once")
    with pytest.raises(TypeError, match="already an aitune Module"):
        Module(wrapped)
    with pytest.raises(ValueError, match="already wrapped by aitune Module 'once'"):
        Module(raw)
    with pytest.raises(TypeError, match=r"torch\.nn\.Module"):
        Module(lambda x: x)
    with pytest.raises(TypeError, match="TuneStrategy"):
        Module(MLP(), strategy="fast")


def test_recording_two_batch_sizes_detects_the_batch_axis():
    model = build()
    model.encoder = Module(model.encoder, "enc")
    model.encoder.enable_recording()
    outputs = {}
    for batch_size in (2, 4):
        x = torch.randn(batch_size, 8)
        with global_context:
            global_context.set(BATCH_SIZE_KEY, batch_size)
            outputs[batch_size] = (model(x), x)
    (spec,) = model.encoder.graph_specs
    (tensor,) = spec.input_spec.tensors
    assert tensor.shape == ("batch0", 8) and tensor.min_shape == (2, 8) and tensor.max_shape == (4, 8)
    assert spec.output_spec.tensors[0].shape == ("batch0", 6)
    # recording returns the original output
    x = outputs[4][1]
    assert torch.equal(outputs[4][0], model.head(MLP.forward(model.encoder.__wrapped__, x)))


def test_parent_holding_the_raw_module_is_routed_too():
    model = build()
    wrapper = Module(model.encoder, "enc")  # not assigned back into the model
    wrapper.enable_recording()
    model(torch.randn(2, 8))
    assert len(wrapper.graph_specs) == 1


def test_state_transitions_and_force_semantics(monkeypatch):
    wrapped = Module(MLP(), "m")
    with pytest.raises(RuntimeError, match="not tuned"):
        wrapped.activate()
    with pytest.raises(ValueError, match="has not recorded any samples"):
        wrapped.tune()
    wrapped.enable_recording()
    assert wrapped.state is ModuleState.RECORDING
    wrapped(torch.randn(1, 8))
    wrapped.enable_passthrough()
    assert wrapped.state is ModuleState.PASSTHROUGH
    wrapped(torch.randn(5, 8))  # not recorded
    wrapped.enable_recording()  # continues the previous recording
    wrapped(torch.randn(3, 8))
    (spec,) = wrapped.graph_specs
    assert spec.input_spec.tensors[0].max_shape == (3, 8)

    # pretend it was tuned, then check that leaving TUNED needs force
    monkeypatch.setattr(wrapped, "_self_state", ModuleState.TUNED)
    for method in (wrapped.enable_passthrough, wrapped.enable_recording):
        with pytest.raises(RuntimeError, match=r"already tuned. Use enable_\w+\(force=True\)"):
            method()
    assert wrapped.state is ModuleState.TUNED
    wrapped.enable_recording(force=True)
    assert wrapped.state is ModuleState.RECORDING and wrapped.graph_specs == []  # reset drops the recording
    with pytest.raises(RuntimeError, match="not tuned"):
        wrapped.to_dict()


def test_default_strategy_is_overridable(monkeypatch):
    sentinel = object()
    monkeypatch.setattr(strategy_choice, "default_strategy_factory", lambda: sentinel)
    assert aot_module.default_strategy() is sentinel


def test_deepcopy_and_pickle_fail_clearly():
    import copy
    import pickle

    wrapped = Module(MLP(), "m")
    with pytest.raises(TypeError, match="cannot be deep-copied"):
        copy.deepcopy(wrapped)
    with pytest.raises(TypeError, match=r"aitune\.torch\.save"):
        pickle.dumps(wrapped)


def test_a_class_level_forward_patch_after_wrapping_answers_with_the_new_forward(caplog):
    class Patchable(MLP):
        pass

    raw = Patchable()
    wrapped = Module(raw, "patchable")
    x = torch.randn(2, raw.fc1.in_features)
    Patchable.forward = lambda self, x: self.fc1(x) * 0 + 7  # the program patches the class after wrapping
    with caplog.at_level("WARNING", logger="aitune"):
        outputs = [wrapped(x), raw(x)]
    for out in outputs:
        torch.testing.assert_close(out, torch.full_like(raw.fc1(x), 7.0))
    assert sum("Patchable.forward was replaced" in r.getMessage() for r in caplog.records) == 1
