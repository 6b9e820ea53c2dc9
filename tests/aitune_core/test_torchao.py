"""TorchAOBackend on CPU: int8 weight-only / dynamic quantization of a copy, tolerance, checkpoints."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from backend_models import MLP, ConvOnly, TransformerBlock, block_call, image_call, mlp_call, record
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

from aitune_core.backends.backend import BackendState
from aitune_core.backends.torchao import (
    TorchAOBackend,
    TorchAOBackendConfig,
    check_float8_device,
    count_quantized_tensors,
)
from aitune_core.config import config
from aitune_core.errors import BackendBuildError, ValidationError
from aitune_core.strategies.one_backend import OneBackendStrategy
from aitune_core.validation.tolerance import quantized_tolerance

quantization = pytest.importorskip("torchao.quantization")

CPU = torch.device("cpu")
REPO = Path(__file__).resolve().parents[2]
CONFIGS = {
    "int8_weight_only": quantization.Int8WeightOnlyConfig,
    "int8_dynamic": quantization.Int8DynamicActivationInt8WeightConfig,
}
MODELS = {"mlp": (MLP, mlp_call), "transformer_block": (TransformerBlock, block_call)}


def _backend(config_name: str, **kwargs) -> TorchAOBackend:
    return TorchAOBackend(TorchAOBackendConfig(quantization_config=CONFIGS[config_name](), compile=False, **kwargs))


def _tune(module, make_call, tmp_path, backend):
    torch.manual_seed(0)
    spec, samples = record(module, make_call)
    return OneBackendStrategy(backend).tune(module, "m", spec, samples, CPU, tmp_path), spec


def test_describe_renders_the_torchao_config_like_the_seed_log():
    backend = TorchAOBackend(TorchAOBackendConfig(quantization_config=quantization.Int8WeightOnlyConfig()))
    assert backend.describe() == "TorchAOBackend(quantization_config=Int8WeightOnlyConfig())"
    assert TorchAOBackend().describe() == "TorchAOBackend()"
    assert _backend("int8_dynamic").describe() == (
        "TorchAOBackend(quantization_config=Int8DynamicActivationInt8WeightConfig(),compile=False)"
    )
    assert backend.key() != _backend("int8_weight_only").key()


def test_config_needs_a_config_instance():
    with pytest.raises(ValueError, match="config instance"):
        TorchAOBackendConfig(quantization_config=quantization.Int8WeightOnlyConfig)
    with pytest.raises(ValueError, match="config instance"):
        TorchAOBackendConfig(quantization_config="int8")


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_quantizes_a_copy_and_stays_within_the_quantized_tolerance(tmp_path, model_name, config_name):
    model_cls, make_call = MODELS[model_name]
    torch.manual_seed(0)
    module = model_cls().eval()
    weights_before = {k: v.clone() for k, v in module.state_dict().items()}
    backend, _ = _tune(module, make_call, tmp_path, _backend(config_name))
    assert backend.state is BackendState.ACTIVE and not backend.is_jit
    # the user's module is untouched: plain float weights, same values
    assert count_quantized_tensors(module) == 0
    for key, value in module.state_dict().items():
        assert torch.equal(value, weights_before[key]), key
    quantized = backend.quantized_module
    assert quantized is not module and count_quantized_tensors(quantized) > 0
    tol = quantized_tolerance(torch.float32, CPU)
    for batch in (3, 5):  # batch sizes never recorded
        args, kwargs = make_call(batch)
        with torch.no_grad():
            got, want = backend.infer(*args, **kwargs), module(*args, **kwargs)
        torch.testing.assert_close(got, want, rtol=tol.rtol, atol=tol.atol)
        assert not torch.equal(got, want)  # it really runs quantized weights


def test_a_quantized_result_outside_the_tolerance_is_rejected(tmp_path):
    module = MLP().eval()
    with config.override(quantized_rtol=1e-7, quantized_atol=1e-7), pytest.raises(ValidationError, match="outside"):
        _tune(module, mlp_call, tmp_path, _backend("int8_dynamic"))


def test_tolerance_follows_the_config():
    backend = _backend("int8_weight_only")
    assert backend.tolerance(torch.float32) == quantized_tolerance(torch.float32, None)
    with config.override(quantized_rtol=0.3, quantized_atol=0.05):
        tol = backend.tolerance(torch.float32)
    assert (tol.rtol, tol.atol) == (0.3, 0.05)
    assert backend.tolerance(torch.int64).exact


def test_a_module_without_quantizable_layers_fails_the_build(tmp_path):
    with pytest.raises(BackendBuildError, match="quantized no layer of ConvOnly"):
        _tune(ConvOnly().eval(), image_call, tmp_path, _backend("int8_weight_only"))


def test_nothing_quantized_hint_names_the_float8_shape_rule():
    from aitune_core.backends.torchao import nothing_quantized_hint

    assert "multiples of 16" in nothing_quantized_hint(quantization.Float8DynamicActivationFloat8WeightConfig())
    hint = nothing_quantized_hint(quantization.Int8WeightOnlyConfig())
    assert "nn.Linear" in hint and "16" not in hint


def test_float8_needs_compute_capability_8_9(monkeypatch):
    config_f8 = quantization.Float8DynamicActivationFloat8WeightConfig()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "A100")
    with pytest.raises(BackendBuildError, match=r"compute capability >= 8.9; A100 has 8.0"):
        check_float8_device(config_f8, torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_float8_device(config_f8, torch.device("cuda"))
    check_float8_device(quantization.Int8WeightOnlyConfig(), torch.device("cuda"))  # only float8 is checked


def test_deactivate_and_activate_restore_the_same_quantized_weights(tmp_path):
    module = MLP().eval()
    backend, _ = _tune(module, mlp_call, tmp_path, _backend("int8_weight_only"))
    (x,), _ = mlp_call(3)
    before = backend.infer(x)
    backend.deactivate()
    assert backend.quantized_module is None
    backend.activate()
    torch.testing.assert_close(backend.infer(x), before, rtol=0, atol=0)


def test_checkpoint_restores_quantized_weights_without_quantizing_again(tmp_path, monkeypatch):
    module = TransformerBlock().eval()
    backend, _ = _tune(module, block_call, tmp_path, _backend("int8_dynamic"))
    args, kwargs = block_call(3)
    expected = backend.infer(*args, **kwargs)
    state = backend.to_dict()
    artifact = state["quantized_state"]
    assert isinstance(artifact, Path) and artifact.is_file()

    def no_quantize(*_args, **_kwargs):
        raise AssertionError("quantize_ must not run when loading")

    monkeypatch.setattr(quantization, "quantize_", no_quantize)
    # the float weights of the module passed to from_dict do not matter: the quantized ones come from the artifact
    with torch.no_grad():
        for p in module.parameters():
            p.add_(1.0)
    loaded = TorchAOBackend.from_dict(module, state)
    assert loaded.state is BackendState.CHECKPOINT_LOADED
    loaded.deploy()
    assert count_quantized_tensors(loaded.quantized_module) == count_quantized_tensors(backend.quantized_module)
    torch.testing.assert_close(loaded.infer(*args, **kwargs), expected, rtol=0, atol=0)


@pytest.mark.slow
def test_compile_true_wraps_the_quantized_copy_with_inductor(tmp_path):
    module = MLP().eval()
    class_entries = len(_debug_get_cache_entry_list(MLP.forward.__code__))
    backend = TorchAOBackend(TorchAOBackendConfig(quantization_config=quantization.Int8WeightOnlyConfig()))
    backend, _ = _tune(module, mlp_call, tmp_path, backend)
    entry = backend._runner._torchdynamo_orig_callable  # torch.compile's wrapper of the function it compiles
    assert entry.__wrapped__ is backend._quantized
    (x,), _ = mlp_call(5)
    tol = backend.tolerance(torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(backend.infer(x), module(x), rtol=tol.rtol, atol=tol.atol)
    # compiled on its own entry: dynamo's entries are on it, none added to the class's forward (isolated_entry)
    assert len(_debug_get_cache_entry_list(entry.__code__)) >= 1
    assert len(_debug_get_cache_entry_list(MLP.forward.__code__)) == class_entries


@pytest.mark.parametrize("config_name", list(CONFIGS))
def test_save_and_load_in_a_fresh_process_without_quantizing_again(tmp_path, config_name):
    import aitune.torch as ait

    torch.manual_seed(0)
    model = TransformerBlock().eval()
    wrapped = ait.Module(model, "block", strategy=ait.OneBackendStrategy(_backend(config_name)))
    dataset = [{"x": torch.randn(8, 64), "mask": torch.ones(8)} for _ in range(4)]
    with ait.config.override(cache_dir=tmp_path / "cache"):
        ait.tune(wrapped, dataset, batch_sizes=[2, 4])
        args, kwargs = block_call(3)
        expected = wrapped(*args, **kwargs)
        assert [type(b).__name__ for _, b in wrapped.backends] == ["TorchAOBackend"]
        ait.save(wrapped, tmp_path / "ckpt")
    torch.save({"args": args, "kwargs": kwargs, "expected": expected}, tmp_path / "io.pt")
    script = textwrap.dedent(
        f"""
        import torch, aitune.torch as ait
        import torchao.quantization, torchao.quantization.quant_api
        from backend_models import TransformerBlock
        def no_quantize(*a, **k):
            raise AssertionError("quantize_ must not run when loading")
        torchao.quantization.quantize_ = torchao.quantization.quant_api.quantize_ = no_quantize
        io = torch.load({str(tmp_path / "io.pt")!r}, weights_only=False)
        torch.manual_seed(1)  # other float weights: the checkpoint restores the module's weights and the quantized ones
        wrapped = ait.Module(TransformerBlock().eval(), "block")
        ait.load(wrapped, {str(tmp_path / "ckpt")!r})
        backends = wrapped.backends
        assert [type(b).__name__ for _, b in backends] == ["TorchAOBackend"], backends
        assert backends[0][1].quantized_module is not None
        got = wrapped(*io["args"], **io["kwargs"])
        torch.testing.assert_close(got, io["expected"], rtol=0, atol=0)
        print("LOADED-OK")
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), str(REPO / "src")])}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert "LOADED-OK" in result.stdout, result.stdout + result.stderr


class _Boom:
    """Unpickling it runs code (what a planted pickle would do)."""

    def __reduce__(self):
        return (os.system, ("touch /tmp/aitune-pwned-torchao",))


def test_checkpoint_state_is_json_and_weights_only(tmp_path):
    """The config travels as torchao JSON (no pickled object in the checkpoint) and the quantized state loads with
    torch.load(weights_only=True); a pickle planted as the quantized state is refused, never run."""
    import json

    from aitune_core.checkpoint.backend_state import pack_backend, unpack_backend_state
    from aitune_core.checkpoint.manifest import CheckpointReader, CheckpointWriter

    module = MLP().eval()
    backend, _ = _tune(module, mlp_call, tmp_path / "cache", _backend("int8_weight_only"))
    with CheckpointWriter(tmp_path / "ckpt") as writer:
        entry = pack_backend(backend, writer, "b")
        writer.commit({"entry": entry})
    assert entry["state_file"] is None  # nothing needed a torch file: the config is JSON
    qc = entry["state"]["config"]["quantization_config"]["__torchao_config__"]
    assert qc["_type"] == "Int8WeightOnlyConfig" and json.dumps(qc)
    reader = CheckpointReader(tmp_path / "ckpt")
    reader.verify()
    state = unpack_backend_state(reader.manifest["entry"], reader)
    loaded = TorchAOBackend.from_dict(module, state)
    assert type(loaded.config.quantization_config).__name__ == "Int8WeightOnlyConfig"
    loaded.deploy()
    args, kwargs = mlp_call(2)
    torch.testing.assert_close(loaded.infer(*args, **kwargs), backend.infer(*args, **kwargs), rtol=0, atol=0)

    marker = Path("/tmp/aitune-pwned-torchao")
    marker.unlink(missing_ok=True)
    torch.save({"0.weight": _Boom()}, state["quantized_state"])  # a planted pickle in place of the state
    planted = TorchAOBackend.from_dict(module, state)
    with pytest.raises(Exception, match=r"[Ww]eights only load failed|Unsupported global"):
        planted.deploy()
    assert not marker.exists()


@pytest.mark.parametrize(
    "payload",
    [
        {"_type": "quantize_", "_data": {}},  # a function of an allowed module
        {"_type": "Int8WeightOnlyConfig", "_data": {"granularity": {"_type": "torch.dtype", "_data": "load"}}},
        {"_type": "NoSuchConfig", "_data": {}},
    ],
)
def test_config_json_naming_anything_but_a_torchao_config_class_is_refused(payload):
    with pytest.raises(ValueError, match="torchao config"):
        TorchAOBackendConfig.from_dict({"quantization_config": {"__torchao_config__": payload}, "compile": False})


@pytest.mark.parametrize(
    "make",
    [
        lambda q: q.Int8WeightOnlyConfig(),
        lambda q: q.Int8DynamicActivationInt8WeightConfig(),
        lambda q: q.Float8DynamicActivationFloat8WeightConfig(),  # dtypes, granularity list, enum, a NamedTuple
        lambda q: q.Float8DynamicActivationFloat8WeightConfig(granularity=q.PerRow()),
        lambda q: q.Int4WeightOnlyConfig(group_size=32),
    ],
)
def test_torchao_configs_round_trip_through_json(make):
    import json

    config = TorchAOBackendConfig(quantization_config=make(quantization), compile=False)
    stored = json.loads(json.dumps(config.to_dict()))  # what a manifest holds
    assert TorchAOBackendConfig.from_dict(stored) == config
