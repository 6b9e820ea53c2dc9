"""GraphSpec-driven ONNX export: flat wrapper, dynamic dimension names, sample choice, exporters."""

import pytest
import torch
from backend_models import (
    MLP,
    DictInTupleOut,
    SmallCNN,
    TransformerBlock,
    block_call,
    dict_call,
    image_call,
    mlp_call,
    record,
)

from aitune_core.backends.onnx_export import (
    FlatModule,
    check_flat_graph,
    dynamic_dims,
    export_onnx,
    export_program,
    export_sample,
    input_names,
    output_names,
)
from aitune_core.errors import BackendBuildError
from aitune_core.recording.graph_recorder import GraphRecorder
from aitune_core.specs.tree import flatten_values

onnx = pytest.importorskip("onnx")


def _dims(value_info):
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def test_flat_module_round_trips_nested_inputs_and_outputs():
    torch.manual_seed(0)
    module = DictInTupleOut().eval()
    spec, samples = record(module, dict_call)
    assert input_names(spec) == ["inputs_pixels", "inputs_tokens", "bias"]
    assert output_names(spec) == ["outputs_0", "outputs_1_pooled", "outputs_1_tokens"]
    sample = samples[0]
    flat_inputs = spec.input_tensors(sample.args, sample.kwargs)
    with torch.no_grad():
        flat_outputs = FlatModule(module, spec)(*flat_inputs)
    expected = [v for v in flatten_values(sample.output)[0] if isinstance(v, torch.Tensor)]
    assert len(flat_outputs) == len(expected)
    for got, want in zip(flat_outputs, expected):
        torch.testing.assert_close(got, want)
    rebuilt = spec.output_spec.unflatten(list(flat_outputs))
    assert isinstance(rebuilt, tuple) and set(rebuilt[1]) == {"pooled", "tokens"}


def test_dimension_names_batch_shared_dynamic_prefixed():
    torch.manual_seed(0)
    calls = iter([(2, 8), (4, 16), (8, 4)])

    def make_call(_batch):
        batch, seq = next(calls)
        return block_call(batch, seq=seq)

    spec, _ = record(TransformerBlock(), make_call, batch_sizes=(2, 4, 8))
    assert dynamic_dims(spec.input_spec.tensors) == [{0: "batch0", 1: "x_dim1"}, {0: "batch0", 1: "mask_dim1"}]


def test_export_names_dynamic_dims_in_the_onnx_model(tmp_path):
    torch.manual_seed(0)
    module = SmallCNN().eval()
    spec, samples = record(module, image_call)
    path = export_onnx(module, spec, samples, tmp_path / "onnx", torch.device("cpu"))
    assert path == tmp_path / "onnx" / "model.onnx"
    model = onnx.load(str(path))
    assert [i.name for i in model.graph.input] == ["x"]
    assert _dims(model.graph.input[0]) == ["batch0", 3, 16, 16]
    assert [o.name for o in model.graph.output] == ["outputs"]
    assert _dims(model.graph.output[0]) == ["batch0", 10]


def test_legacy_exporter_uses_dynamic_axes(tmp_path):
    torch.manual_seed(0)
    module = MLP().eval()
    spec, samples = record(module, mlp_call)
    path = export_onnx(module, spec, samples, tmp_path / "legacy", torch.device("cpu"), use_dynamo=False)
    model = onnx.load(str(path))
    assert _dims(model.graph.input[0]) == ["batch0", 32]
    assert _dims(model.graph.output[0]) == ["batch0", 16]


def test_export_sample_prefers_dynamic_axes_of_two_or_more():
    torch.manual_seed(0)
    calls = iter([(1, 8), (8, 1), (2, 2), (1, 1)])

    def make_call(_batch):
        batch, seq = next(calls)
        return block_call(batch, seq=seq)

    spec, samples = record(TransformerBlock(), make_call, batch_sizes=(1, 8, 2, 1))
    chosen = export_sample(spec, samples)
    assert tuple(chosen.args[0].shape[:2]) == (2, 2)  # the (8, 1) sample is larger but would specialize seq to 1


def test_model_that_specializes_a_dynamic_axis_fails_to_export(tmp_path):
    class Specializes(torch.nn.Module):
        def forward(self, x):
            return x.expand(4, 6) * 2  # works for batch 1 and 4 only: export must specialize the batch to 4

    torch.manual_seed(0)
    spec, samples = record(Specializes(), lambda b: ((torch.randn(b, 6),), {}), batch_sizes=(1, 4))
    assert spec.input_spec.tensors[0].shape[0] == "batch0"
    with pytest.raises(BackendBuildError, match="ONNX export of graph 0 failed"):
        export_onnx(Specializes(), spec, samples, tmp_path, torch.device("cpu"))


def test_non_strict_graph_with_differing_constants_is_refused():
    module = MLP()
    recorder = GraphRecorder(lambda x, scale: module(x) * scale, strict=False)
    with torch.no_grad():
        for scale in (1.0, 2.0):
            x = torch.randn(2, 32)
            recorder.record((x, scale), {}, module(x) * scale)
    spec = recorder.graph_specs[0]
    with pytest.raises(BackendBuildError, match="non-tensor arguments"):
        check_flat_graph(spec, recorder.samples(spec))


def test_graph_without_tensor_outputs_is_refused():
    recorder = GraphRecorder(lambda x: int(x.shape[0]))
    x = torch.randn(2, 3)
    recorder.record((x,), {}, 2)
    spec = recorder.graph_specs[0]
    with pytest.raises(BackendBuildError, match="returns no tensors"):
        check_flat_graph(spec, recorder.samples(spec))


def test_export_program_keeps_batch_dynamic_across_inputs():
    torch.manual_seed(0)
    module = DictInTupleOut().eval()
    spec, samples = record(module, dict_call)
    program = export_program(module, spec, samples, torch.device("cpu"))
    args, kwargs = dict_call(5)  # a batch size never recorded
    got = program.module()(*spec.input_tensors(args, kwargs))
    with torch.no_grad():
        want = [v for v in flatten_values(module(*args, **kwargs))[0] if isinstance(v, torch.Tensor)]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("use_dynamo", [True, False])
def test_export_leaves_the_modules_training_flags_as_they_were(tmp_path, use_dynamo):
    torch.manual_seed(0)
    module = SmallCNN()
    module.eval()
    module.bn.train()  # mixed modes: a recursive train(False)/train(True) round trip would lose this
    spec, samples = record(module, image_call)
    export_onnx(module, spec, samples, tmp_path, torch.device("cpu"), use_dynamo=use_dynamo)
    assert {name: sub.training for name, sub in module.named_modules()} == {
        "": False, "conv1": False, "bn": True, "conv2": False, "fc": False
    }


def test_the_flat_view_is_not_seen_by_the_programs_registration_hooks():
    from torch.nn.modules import module as torch_module

    seen = []
    model = torch.nn.Linear(2, 2)
    recorder = GraphRecorder(model)
    with torch.no_grad():
        recorder.record((torch.randn(3, 2),), {}, model(torch.randn(3, 2)))
    handle = torch_module.register_module_module_registration_hook(lambda parent, name, sub: seen.append(name))
    try:
        flat = FlatModule(model, recorder.graph_specs[0])
    finally:
        handle.remove()
    assert seen == [] and flat.module is model
