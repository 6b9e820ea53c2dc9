"""ONNXRuntimeBackend on CPU: dynamic batch, nested inputs/outputs, providers, IO binding, checkpoints."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from backend_models import DictInTupleOut, SmallCNN, dict_call, image_call, record

from aitune_core.backends.backend import BackendState
from aitune_core.backends.onnxruntime import ONNXRuntimeBackend, ONNXRuntimeBackendConfig, resolve_providers
from aitune_core.errors import BackendBuildError, ValidationError
from aitune_core.specs.tree import flatten
from aitune_core.strategies.one_backend import OneBackendStrategy

ort = pytest.importorskip("onnxruntime")

CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[2]


def _tune(module, make_call, tmp_path, backend=None, batch_sizes=(2, 4, 8)):
    torch.manual_seed(0)
    spec, samples = record(module, make_call, batch_sizes)
    strategy = OneBackendStrategy(backend or ONNXRuntimeBackend())
    return strategy.tune(module, "m", spec, samples, CPU, tmp_path), spec


def _assert_same(got, want, rtol=1e-4, atol=1e-5):
    got_leaves, got_tree = flatten(got)
    want_leaves, want_tree = flatten(want)
    assert got_tree == want_tree
    for (path, g), (_, w) in zip(got_leaves, want_leaves):
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, msg=f"output{path}")


def test_cnn_with_dynamic_batch_matches_eager_on_unrecorded_batch_sizes(tmp_path):
    module = SmallCNN().eval()
    backend, spec = _tune(module, image_call, tmp_path)
    assert backend.state is BackendState.ACTIVE and not backend.is_jit
    assert backend.providers == ["CPUExecutionProvider"]
    assert spec.input_spec.tensors[0].shape[0] == "batch0"
    for batch in (3, 5, 7):
        (x,), _ = image_call(batch)
        with torch.no_grad():
            _assert_same(backend.infer(x), module(x))


def test_dict_inputs_and_tuple_output_keep_their_structure(tmp_path):
    module = DictInTupleOut().eval()
    backend, _ = _tune(module, dict_call, tmp_path)
    for batch in (3, 6):
        args, kwargs = dict_call(batch)
        got = backend.infer(*args, **kwargs)
        assert isinstance(got, tuple) and isinstance(got[1], dict)
        with torch.no_grad():
            _assert_same(got, module(*args, **kwargs))


def test_legacy_exporter_works_too(tmp_path):
    module = SmallCNN().eval()
    backend, _ = _tune(module, image_call, tmp_path, ONNXRuntimeBackend(ONNXRuntimeBackendConfig(use_dynamo=False)))
    (x,), _ = image_call(5)
    with torch.no_grad():
        _assert_same(backend.infer(x), module(x))


def test_a_model_whose_export_is_only_right_for_some_batch_sizes_is_rejected(tmp_path):
    class Branchy(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.shape[0] > 3 else x * 3  # the export traces one branch (guarded, not failing)

    with pytest.raises(ValidationError, match="differs from the original module's output"):
        _tune(Branchy(), lambda b: ((torch.randn(b, 6),), {}), tmp_path)


def test_unavailable_provider_fails_the_build_listing_the_available_ones(tmp_path):
    backend = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(providers=("CUDAExecutionProvider",)))
    with pytest.raises(BackendBuildError) as info:
        _tune(SmallCNN().eval(), image_call, tmp_path, backend)
    message = str(info.value)
    assert "CUDAExecutionProvider not available" in message
    assert "available providers: " in message and "CPUExecutionProvider" in message


def test_an_opset_the_installed_onnx_lacks_fails_the_build_before_the_exporter_runs(tmp_path, capfd):
    pytest.importorskip("onnx")
    backend = ONNXRuntimeBackend(ONNXRuntimeBackendConfig(opset_version=999))
    with pytest.raises(BackendBuildError, match="opset_version=999 is not an opset the installed onnx"):
        _tune(SmallCNN().eval(), image_call, tmp_path, backend)
    assert "Traceback" not in capfd.readouterr().err  # (the exporter printed one before)


def test_provider_resolution():
    available = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    assert resolve_providers(None, available, CPU) == ["CPUExecutionProvider"]
    assert resolve_providers(None, available, torch.device("cuda")) == available
    assert resolve_providers(None, ["CPUExecutionProvider"], torch.device("cuda")) == ["CPUExecutionProvider"]
    with pytest.raises(BackendBuildError, match="need a CUDA device"):
        resolve_providers(("CUDAExecutionProvider",), available, CPU)
    with pytest.raises(ValueError, match="sequence of provider names"):
        ONNXRuntimeBackendConfig(providers="CPUExecutionProvider")
    assert ONNXRuntimeBackendConfig(providers=["CPUExecutionProvider"]).providers == ("CPUExecutionProvider",)


def test_inputs_are_bound_by_address_without_copies(tmp_path, monkeypatch):
    module = SmallCNN().eval()
    backend, _ = _tune(module, image_call, tmp_path)
    session = backend._session
    bound = []
    real_io_binding = session.io_binding

    class SpyBinding:
        def __init__(self):
            self._binding = real_io_binding()

        def bind_input(self, name, device_type, device_id, element_type, shape, buffer_ptr):
            bound.append((name, device_type, shape, buffer_ptr))
            return self._binding.bind_input(name, device_type, device_id, element_type, shape, buffer_ptr)

        def __getattr__(self, item):
            return getattr(self._binding, item)

    monkeypatch.setattr(session, "io_binding", SpyBinding, raising=False)
    x = torch.randn(3, 3, 16, 16)
    out = backend.infer(x)
    assert bound == [("x", "cpu", (3, 3, 16, 16), x.data_ptr())]
    with torch.no_grad():
        _assert_same(out, module(x))


def test_deactivate_and_activate_recreate_the_session(tmp_path):
    module = SmallCNN().eval()
    backend, _ = _tune(module, image_call, tmp_path)
    backend.deactivate()
    assert backend._session is None
    backend.activate()
    (x,), _ = image_call(3)
    with torch.no_grad():
        _assert_same(backend.infer(x), module(x))


def test_checkpoint_state_has_the_onnx_folder_as_artifact_and_loads_without_the_module(tmp_path):
    module = DictInTupleOut().eval()
    backend, _ = _tune(module, dict_call, tmp_path)
    state = backend.to_dict()
    artifact = state["onnx_model"]
    assert isinstance(artifact, Path) and (artifact / "model.onnx").is_file()
    loaded = ONNXRuntimeBackend.from_dict(None, state)
    assert loaded.state is BackendState.CHECKPOINT_LOADED
    loaded.deploy()
    args, kwargs = dict_call(5)
    with torch.no_grad():
        _assert_same(loaded.infer(*args, **kwargs), module(*args, **kwargs))


def test_save_and_load_in_a_fresh_process(tmp_path):
    import aitune.torch as ait

    torch.manual_seed(0)
    model = DictInTupleOut().eval()
    wrapped = ait.Module(model, "dict_model", strategy=ait.OneBackendStrategy(ait.backend.ONNXRuntimeBackend()))
    dataset = [
        {"inputs": {"pixels": torch.randn(3, 8, 8), "tokens": torch.randint(0, 50, (5,))}, "bias": torch.randn(3),
         "scale": 0.5}
        for _ in range(4)
    ]
    with ait.config.override(cache_dir=tmp_path / "cache"):
        ait.tune(wrapped, dataset, batch_sizes=[2, 4])
        args, kwargs = dict_call(3)
        expected = wrapped(*args, **kwargs)
        ait.save(wrapped, tmp_path / "ckpt")
    torch.save({"model": model.state_dict(), "args": args, "kwargs": kwargs, "expected": expected},
               tmp_path / "io.pt")
    script = textwrap.dedent(
        f"""
        import torch, aitune.torch as ait
        import torch.onnx
        from backend_models import DictInTupleOut
        def no_export(*a, **k):
            raise AssertionError("loading must not export again")
        torch.onnx.export = no_export
        io = torch.load({str(tmp_path / "io.pt")!r}, weights_only=False)
        model = DictInTupleOut().eval()
        wrapped = ait.Module(model, "dict_model")
        ait.load(wrapped, {str(tmp_path / "ckpt")!r})
        backends = [type(b).__name__ for _, b in wrapped.backends]
        assert backends == ["ONNXRuntimeBackend"], backends
        got = wrapped(*io["args"], **io["kwargs"])
        torch.testing.assert_close(got[0], io["expected"][0], rtol=1e-4, atol=1e-5)
        for key in ("pooled", "tokens"):
            torch.testing.assert_close(got[1][key], io["expected"][1][key], rtol=1e-4, atol=1e-5)
        print("LOADED-OK")
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(REPO / "src")])}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert "LOADED-OK" in result.stdout, result.stdout + result.stderr


def test_an_input_the_graph_does_not_use_is_fine(tmp_path):
    class IgnoresMask(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(6, 2)

        def forward(self, x, mask):
            return self.fc(x)

    module = IgnoresMask().eval()
    backend, _ = _tune(module, lambda b: ((torch.randn(b, 6), torch.ones(b, 6)), {}), tmp_path)
    x = torch.randn(5, 6)
    with torch.no_grad():
        _assert_same(backend.infer(x, torch.zeros(5, 6)), module(x, None))
