"""TorchTensorRTBackend: missing-library behaviour, config, and (with a stand-in torch_tensorrt) the compile call it
makes. The real-library test at the end runs only where torch_tensorrt and a GPU exist (never in this CI)."""

import importlib.util
import sys

import pytest
import torch
from backend_models import MLP, DictInTupleOut, dict_call, mlp_call, record

pytest.importorskip("onnx")  # (the stand-in tensorrt parses ONNX: an install without the onnx extra skips these)
from fake_tensorrt import make_fake_torch_tensorrt

import aitune_core.backends.torch_tensorrt as tt_backend
from aitune_core.backends.backend import BackendState
from aitune_core.backends.torch_eager import TorchEagerBackend
from aitune_core.backends.torch_tensorrt import TorchTensorRTBackend, TorchTensorRTBackendConfig
from aitune_core.errors import BackendBuildError, BackendNotAvailableError
from aitune_core.specs.tree import flatten
from aitune_core.strategies.first_wins import FirstWinsStrategy
from aitune_core.strategies.one_backend import OneBackendStrategy

CPU = torch.device("cpu")
HAS_TORCH_TENSORRT = importlib.util.find_spec("torch_tensorrt") is not None
MESSAGE = "torch_tensorrt is not installed; pip install 'aitune[tensorrt]'"


@pytest.fixture
def fake_torch_trt(monkeypatch):
    torch_trt = make_fake_torch_tensorrt()
    monkeypatch.setitem(sys.modules, "torch_tensorrt", torch_trt)
    monkeypatch.setattr(tt_backend, "require_cuda", lambda device, owner: None)
    return torch_trt


BATCHES = (2, 4, 4, 8)  # 4 is the most frequent: the profiles' opt


def _assert_same(got, want):
    got_leaves, got_tree = flatten(got)
    want_leaves, want_tree = flatten(want)
    assert got_tree == want_tree
    for (_, g), (_, w) in zip(got_leaves, want_leaves):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(HAS_TORCH_TENSORRT, reason="torch_tensorrt is installed")
def test_building_without_torch_tensorrt_gives_the_install_message(tmp_path):
    module = MLP().eval()
    spec, samples = record(module, mlp_call, BATCHES)
    with pytest.raises(BackendNotAvailableError) as info:
        OneBackendStrategy(TorchTensorRTBackend()).tune(module, "m", spec, samples, CPU, tmp_path)
    assert str(info.value) == MESSAGE
    report = FirstWinsStrategy([TorchTensorRTBackend(), TorchEagerBackend()]).tune_with_report(
        module, "m", spec, samples, CPU, tmp_path
    )
    assert isinstance(report.backend, TorchEagerBackend)
    assert MESSAGE in report.candidates[0].error


def test_config_validation_and_compile_options():
    config = TorchTensorRTBackendConfig(precision="fp16", min_block_size=3, optimization_level=4)
    assert TorchTensorRTBackend(config).describe() == (
        "TorchTensorRTBackend(precision='fp16',min_block_size=3,optimization_level=4)"
    )
    assert config.compile_options() == {
        "enabled_precisions": {torch.float32, torch.float16}, "min_block_size": 3, "optimization_level": 4
    }
    assert TorchTensorRTBackendConfig().compile_options() == {"enabled_precisions": {torch.float32}}
    with pytest.raises(ValueError, match="precision must be one of"):
        TorchTensorRTBackendConfig(precision="int8")
    with pytest.raises(ValueError, match="min_block_size"):
        TorchTensorRTBackendConfig(min_block_size=0)


def test_a_cpu_device_is_refused(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch_tensorrt", make_fake_torch_tensorrt())
    spec, samples = record(MLP().eval(), mlp_call, BATCHES)
    with pytest.raises(BackendBuildError, match="needs a CUDA device"):
        TorchTensorRTBackend().build(MLP().eval(), spec, samples, CPU, tmp_path)


def test_compiles_the_exported_flat_graph_with_min_opt_max_inputs(fake_torch_trt, tmp_path):
    module = DictInTupleOut().eval()
    spec, samples = record(module, dict_call, BATCHES)
    backend = TorchTensorRTBackend(TorchTensorRTBackendConfig(precision="bf16"))
    backend.build(module, spec, samples, CPU, tmp_path)
    (call,) = fake_torch_trt.calls
    assert call["ir"] == "dynamo"
    assert isinstance(call["module"], torch.export.ExportedProgram)
    assert [repr(i) for i in call["inputs"]] == [
        "Input(min=(2, 3, 8, 8), opt=(4, 3, 8, 8), max=(8, 3, 8, 8), dtype=torch.float32)",
        "Input(min=(2, 5), opt=(4, 5), max=(8, 5), dtype=torch.int64)",
        "Input(min=(2, 3), opt=(4, 3), max=(8, 3), dtype=torch.float32)",
    ]
    assert call["options"] == {"device": CPU, "enabled_precisions": {torch.float32, torch.bfloat16}}
    # the stand-in runs the exported program: nested inputs and outputs go through the flat graph and back
    for batch in (3, 7):
        args, kwargs = dict_call(batch)
        with torch.no_grad():
            _assert_same(backend.infer(*args, **kwargs), module(*args, **kwargs))


def test_checkpoint_keeps_config_and_spec_and_compiles_again_from_the_module(fake_torch_trt, tmp_path):
    module = DictInTupleOut().eval()
    spec, samples = record(module, dict_call, BATCHES)
    backend = TorchTensorRTBackend()
    backend.build(module, spec, samples, CPU, tmp_path)
    state = backend.to_dict()
    assert state["profiles"]["bias"] == {"min": [2, 3], "opt": [4, 3], "max": [8, 3]}
    with pytest.raises(Exception, match="needs the original module"):
        TorchTensorRTBackend.from_dict(None, state)
    loaded = TorchTensorRTBackend.from_dict(module, state)
    assert loaded.state is BackendState.CHECKPOINT_LOADED and loaded.is_jit
    loaded.deploy()
    assert len(fake_torch_trt.calls) == 2  # compiled again, with the same min/opt/max inputs
    assert [repr(i) for i in fake_torch_trt.calls[1]["inputs"]] == [repr(i) for i in fake_torch_trt.calls[0]["inputs"]]
    args, kwargs = dict_call(5)
    with torch.no_grad():
        _assert_same(loaded.infer(*args, **kwargs), module(*args, **kwargs))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_torch_tensorrt_end_to_end(tmp_path):
    pytest.importorskip("torch_tensorrt")
    device = torch.device("cuda")
    module = MLP().eval().to(device)
    torch.manual_seed(0)
    spec, samples = record(module, lambda b: ((torch.randn(b, 32, device=device),), {}))
    backend = OneBackendStrategy(TorchTensorRTBackend()).tune(module, "m", spec, samples, device, tmp_path)
    x = torch.randn(5, 32, device=device)
    tol = backend.tolerance(torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(backend.infer(x), module(x), rtol=tol.rtol, atol=tol.atol)
