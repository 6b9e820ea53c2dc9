"""AOT: a tuned `aitune.torch.Module` follows the model (weights, structure, mode, hooks) with every CPU backend."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "aitune_core"))  # follow_scenarios

from follow_scenarios import CHANGES, eager_twin, make_net, run_scenarios

from aitune_aot.module import Module, ModuleState
from aitune_aot.tune import tune
from aitune_core.backends.onnxruntime import ONNXRuntimeBackend
from aitune_core.backends.torch_eager import TorchEagerBackend
from aitune_core.backends.torch_inductor import TorchInductorBackend
from aitune_core.strategies.one_backend import OneBackendStrategy


def _onnxruntime() -> ONNXRuntimeBackend:
    """The ONNX Runtime backend; its tests skip where the onnx extra is not installed."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    return ONNXRuntimeBackend()


def _torchao():
    quantization = pytest.importorskip("torchao.quantization")
    from aitune_core.backends.torchao import TorchAOBackend, TorchAOBackendConfig

    return TorchAOBackend(TorchAOBackendConfig(quantization_config=quantization.Int8WeightOnlyConfig(), compile=False))


BACKENDS = {
    "eager": (TorchEagerBackend, 1e-5),
    "onnxruntime": (_onnxruntime, 1e-4),
    "torchao": (_torchao, 0.1),
    "inductor": (TorchInductorBackend, 1e-4),
}


@pytest.mark.parametrize(
    "backend_name", ["eager", "onnxruntime", "torchao", pytest.param("inductor", marks=pytest.mark.slow)]
)
def test_tuned_module_follows_every_change(backend_name):
    make_backend, tolerance = BACKENDS[backend_name]
    net = make_net()
    eager = eager_twin(net)
    wrapped = Module(net, "follow")
    tune(wrapped, [torch.randn(8) for _ in range(3)], batch_sizes=[4], strategy=OneBackendStrategy(make_backend()))
    assert wrapped.state is ModuleState.TUNED

    def serving() -> bool:
        dispatcher = wrapped._self_dispatcher
        return dispatcher is not None and not dispatcher.watch.stale()

    done = run_scenarios(wrapped, net, eager, serving=serving, atol=tolerance, rtol=tolerance)
    assert len(done) == len(CHANGES) + 6


def test_save_refits_a_changed_baked_backend_first(tmp_path):
    from aitune_aot.checkpoint_io import load, save

    net = make_net()
    eager = eager_twin(net)
    wrapped = Module(net, "follow_save")
    tune(wrapped, [torch.randn(8) for _ in range(3)], batch_sizes=[4], strategy=OneBackendStrategy(
        _onnxruntime()))
    with torch.no_grad():
        for model in (net, eager):
            model.fc2.weight.mul_(-3.0)  # no call before the save: nothing was refit yet
    save(wrapped, tmp_path / "ckpt")
    fresh = load(make_net(seed=1), tmp_path / "ckpt")
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(fresh(x), eager(x), atol=1e-4, rtol=1e-4)
