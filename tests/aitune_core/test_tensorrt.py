"""TensorRTBackend: missing-library behaviour, config, and (with a stand-in tensorrt module) engine build, bindings and
checkpoint layout. The real-library test at the end runs only where tensorrt and a GPU exist (never in this CI)."""

import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest
import torch
from backend_models import MLP, DictInTupleOut, SmallCNN, dict_call, image_call, mlp_call, record

pytest.importorskip("onnx")  # (the stand-in tensorrt parses ONNX: an install without the onnx extra skips these)
from fake_tensorrt import make_fake_tensorrt

import aitune_core.backends.tensorrt as trt_backend
from aitune_core.backends.backend import BackendState
from aitune_core.backends.tensorrt import (
    EngineRunner,
    TensorRTBackend,
    TensorRTBackendConfig,
    build_engine,
)
from aitune_core.backends.torch_eager import TorchEagerBackend
from aitune_core.backends.torch_inductor import TorchInductorBackend
from aitune_core.backends.trt_profiles import ShapeRange
from aitune_core.errors import BackendBuildError, BackendNotAvailableError, CheckpointError
from aitune_core.strategies.first_wins import FirstWinsStrategy
from aitune_core.strategies.one_backend import OneBackendStrategy

CPU = torch.device("cpu")
HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None
MESSAGE = "tensorrt is not installed; pip install 'aitune[tensorrt]'"


@pytest.fixture
def fake_trt(monkeypatch):
    """A stand-in tensorrt module, and CPU allowed as the device (the stand-in never touches memory)."""
    trt = make_fake_tensorrt()
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setattr(trt_backend, "require_cuda", lambda device, owner: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: types.SimpleNamespace(cuda_stream=777))
    return trt


BATCHES = (2, 4, 4, 8)  # 4 is the most frequent: the profiles' opt


# ------------------------------------------------------------------------------------------ without tensorrt
@pytest.mark.skipif(HAS_TENSORRT, reason="tensorrt is installed")
def test_building_without_tensorrt_gives_the_install_message(tmp_path):
    spec, samples = record(MLP().eval(), mlp_call, BATCHES)
    with pytest.raises(BackendNotAvailableError) as info:
        TensorRTBackend().build(MLP().eval(), spec, samples, CPU, tmp_path)
    assert str(info.value) == MESSAGE
    with pytest.raises(BackendNotAvailableError, match="tensorrt is not installed"):
        OneBackendStrategy(TensorRTBackend()).tune(MLP().eval(), "m", spec, samples, CPU, tmp_path)


@pytest.mark.skipif(HAS_TENSORRT, reason="tensorrt is installed")
def test_first_wins_falls_back_past_a_missing_tensorrt(tmp_path):
    module = MLP().eval()
    spec, samples = record(module, mlp_call, BATCHES)
    strategy = FirstWinsStrategy([TensorRTBackend(), TorchEagerBackend()])
    report = strategy.tune_with_report(module, "m", spec, samples, CPU, tmp_path)
    assert isinstance(report.backend, TorchEagerBackend)
    assert MESSAGE in report.candidates[0].error


@pytest.mark.slow
@pytest.mark.skipif(HAS_TENSORRT, reason="tensorrt is installed")
def test_first_wins_tensorrt_then_inductor_ends_on_inductor(tmp_path):
    module = MLP().eval()
    spec, samples = record(module, mlp_call, BATCHES)
    strategy = FirstWinsStrategy([TensorRTBackend(), TorchInductorBackend()])
    report = strategy.tune_with_report(module, "m", spec, samples, CPU, tmp_path)
    assert isinstance(report.backend, TorchInductorBackend)
    assert MESSAGE in report.candidates[0].error
    (x,), _ = mlp_call(3)
    with torch.no_grad():
        torch.testing.assert_close(report.backend.infer(x), module(x), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(HAS_TENSORRT, reason="tensorrt is installed")
def test_deploying_an_engine_checkpoint_without_tensorrt_gives_the_install_message(tmp_path):
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"engine")
    spec, _ = record(MLP().eval(), mlp_call, BATCHES)
    state = {"type": "TensorRTBackend", "config": TensorRTBackendConfig().to_dict(), "device": "cuda:0",
             "engine": engine, "graph_spec": spec.to_dict(), "profiles": {}, "tensorrt_version": "10.9.0"}
    backend = TensorRTBackend.from_dict(None, state)
    with pytest.raises(BackendNotAvailableError, match="tensorrt is not installed"):
        backend.deploy()


# ------------------------------------------------------------------------------------------ configuration
def test_config_validation_and_describe():
    assert TensorRTBackend(TensorRTBackendConfig(precision="fp16")).describe() == "TensorRTBackend(precision='fp16')"
    with pytest.raises(ValueError, match="precision must be one of"):
        TensorRTBackendConfig(precision="fp8")
    with pytest.raises(ValueError, match="builder_optimization_level"):
        TensorRTBackendConfig(builder_optimization_level=6)
    with pytest.raises(ValueError, match="workspace_size"):
        TensorRTBackendConfig(workspace_size=0)
    assert TensorRTBackendConfig(use_dynamo=False).describe() == "use_dynamo=False"


def test_reduced_precision_widens_the_tolerance():
    fp32 = TensorRTBackend().tolerance(torch.float32)
    fp16 = TensorRTBackend(TensorRTBackendConfig(precision="fp16")).tolerance(torch.float32)
    assert fp16.rtol > fp32.rtol and fp16.atol > fp32.atol
    assert TensorRTBackend(TensorRTBackendConfig(precision="bf16")).tolerance(torch.int64).exact


# ------------------------------------------------------------------------------------------ with a stand-in
def test_int8_is_a_documented_build_failure(fake_trt, tmp_path):
    spec, samples = record(MLP().eval(), mlp_call, BATCHES)
    with pytest.raises(BackendBuildError, match="int8 needs calibrated quantization"):
        TensorRTBackend(TensorRTBackendConfig(precision="int8")).build(MLP().eval(), spec, samples, CPU, tmp_path)


def test_a_cpu_device_is_refused(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorrt", make_fake_tensorrt())
    spec, samples = record(MLP().eval(), mlp_call, BATCHES)
    with pytest.raises(BackendBuildError, match="needs a CUDA device"):
        TensorRTBackend().build(MLP().eval(), spec, samples, CPU, tmp_path)


@pytest.mark.parametrize(("precision", "flags"), [("fp32", []), ("fp16", ["FP16"]), ("bf16", ["BF16"])])
def test_build_engine_sets_profiles_flags_and_limits(fake_trt, tmp_path, precision, flags):
    from aitune_core.backends.onnx_export import export_onnx

    module = DictInTupleOut().eval()
    spec, samples = record(module, dict_call, BATCHES)
    onnx_path = export_onnx(module, spec, samples, tmp_path, CPU)
    profiles = {"inputs_pixels": ShapeRange((2, 3, 8, 8), (4, 3, 8, 8), (8, 3, 8, 8)),
                "inputs_tokens": ShapeRange((2, 5), (4, 5), (8, 5)),
                "bias": ShapeRange((2, 3), (4, 3), (8, 3))}
    config = TensorRTBackendConfig(precision=precision, workspace_size=1 << 30, builder_optimization_level=5)
    engine = build_engine(fake_trt, onnx_path, profiles, config)
    assert json.loads(engine)["profile"]["bias"] == [[2, 3], [4, 3], [8, 3]]
    (_, built), = [c for c in fake_trt.calls if c[0] == "build"]
    assert built["flags"] == flags
    assert built["pool_limits"] == {"WORKSPACE": 1 << 30}
    assert built["level"] == 5
    assert built["profiles"] == [{name: (r.min, r.opt, r.max) for name, r in profiles.items()}]
    assert ("create_network", 0) in fake_trt.calls  # TensorRT 10: explicit batch without the deprecated flag


def test_parse_errors_are_reported(fake_trt, tmp_path):
    fake_trt.OnnxParser.fail_with = "Unsupported operator Foo"
    with pytest.raises(BackendBuildError, match=r"could not parse model\.onnx: Unsupported operator Foo"):
        build_engine(fake_trt, tmp_path / "model.onnx", {}, TensorRTBackendConfig())


def test_runner_binds_inputs_and_outputs_by_address_on_the_given_stream(fake_trt, tmp_path):
    from aitune_core.backends.onnx_export import export_onnx

    module = SmallCNN().eval()
    spec, samples = record(module, image_call, BATCHES)
    onnx_path = export_onnx(module, spec, samples, tmp_path, CPU)
    engine = build_engine(fake_trt, onnx_path, {"x": ShapeRange((2, 3, 16, 16), (4, 3, 16, 16), (8, 3, 16, 16))},
                          TensorRTBackendConfig())
    runner = EngineRunner(fake_trt, engine)
    assert (runner.inputs, runner.outputs) == (["x"], ["outputs"])
    x = torch.randn(5, 3, 16, 16)
    outputs = runner.run({"x": x}, 99, CPU)
    context = runner.context
    assert context.addresses["x"] == x.data_ptr()  # the caller's tensor itself, no copy
    assert tuple(outputs["outputs"].shape) == (5, 10)
    assert context.addresses["outputs"] == outputs["outputs"].data_ptr()
    assert context.executed_on == [99]
    with pytest.raises(RuntimeError, match="outside the engine's profile"):
        runner.run({"x": torch.randn(16, 3, 16, 16)}, 99, CPU)


def test_build_infer_and_checkpoint_layout(fake_trt, tmp_path):
    module = DictInTupleOut().eval()
    spec, samples = record(module, dict_call, BATCHES)
    backend = TensorRTBackend(TensorRTBackendConfig(precision="fp16"))
    backend.build(module, spec, samples, CPU, tmp_path)
    assert backend.profiles["inputs_pixels"] == ShapeRange((2, 3, 8, 8), (4, 3, 8, 8), (8, 3, 8, 8))

    args, kwargs = dict_call(3)
    out = backend.infer(*args, **kwargs)  # the stand-in computes nothing: check structure, shapes and bindings
    assert isinstance(out, tuple) and set(out[1]) == {"pooled", "tokens"}
    assert [tuple(t.shape) for t in (out[0], out[1]["pooled"], out[1]["tokens"])] == [(3, 3), (3, 4), (3, 4)]
    assert ("execute", 777) in fake_trt.calls  # the current torch stream's handle

    state = backend.to_dict()
    assert isinstance(state["engine"], Path) and state["engine"].name == "model.engine" and state["engine"].is_file()
    assert state["tensorrt_version"] == "10.9.0"
    assert state["profiles"]["bias"] == {"min": [2, 3], "opt": [4, 3], "max": [8, 3]}
    assert json.loads(json.dumps({k: v for k, v in state.items() if k != "engine"}))  # JSON besides the artifact

    loaded = TensorRTBackend.from_dict(None, state)  # no module needed
    assert loaded.state is BackendState.CHECKPOINT_LOADED and not loaded.is_jit
    fake_trt.calls.clear()
    loaded.deploy()
    assert [c[0] for c in fake_trt.calls] == ["deserialize"]  # no export, no build
    assert [tuple(t.shape) for t in (loaded.infer(*args, **kwargs)[0],)] == [(3, 3)]


def test_an_engine_from_another_tensorrt_version_is_refused_at_deploy(fake_trt, tmp_path):
    module = MLP().eval()
    spec, samples = record(module, mlp_call, BATCHES)
    backend = TensorRTBackend()
    backend.build(module, spec, samples, CPU, tmp_path)
    state = backend.to_dict()
    fake_trt.__version__ = "10.13.0"
    with pytest.raises(CheckpointError, match=r"built with TensorRT 10\.9\.0, this process has 10\.13\.0"):
        TensorRTBackend.from_dict(None, state).deploy()


# ------------------------------------------------------------------------------------------ the real library
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_tensorrt_end_to_end(tmp_path):
    pytest.importorskip("tensorrt")
    device = torch.device("cuda")
    module = SmallCNN().eval().to(device)
    torch.manual_seed(0)
    spec, samples = record(module, lambda b: ((torch.randn(b, 3, 16, 16, device=device),), {}))
    backend = OneBackendStrategy(TensorRTBackend()).tune(module, "m", spec, samples, device, tmp_path)
    x = torch.randn(5, 3, 16, 16, device=device)
    tol = backend.tolerance(torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(backend.infer(x), module(x), rtol=tol.rtol, atol=tol.atol)
    loaded = TensorRTBackend.from_dict(None, backend.to_dict())
    loaded.deploy()
    torch.testing.assert_close(loaded.infer(x), backend.infer(x))
