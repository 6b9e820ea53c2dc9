"""JIT: a tuned module follows the model (weights, structure, mode, hooks) with every CPU backend (issue 17)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "aitune_core"))  # follow_scenarios

from follow_scenarios import CHANGES, SWAPS, bert_block, eager_twin, make_net, run_scenarios, swap_projections

from aitune_core.backends.onnxruntime import ONNXRuntimeBackend
from aitune_core.backends.torch_eager import TorchEagerBackend
from aitune_core.backends.torch_inductor import TorchInductorBackend
from aitune_core.strategies.one_backend import OneBackendStrategy
from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.runtime import bypassed
from aitune_jit.state import NodeState
from aitune_jit.switch import enable


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


def _eager_run(fn):
    with bypassed():
        return fn()


@pytest.mark.parametrize(
    "backend_name", ["eager", "onnxruntime", "torchao", pytest.param("inductor", marks=pytest.mark.slow)]
)
def test_tuned_module_follows_every_change(backend_name, tmp_path):
    make_backend, tolerance = BACKENDS[backend_name]
    jit_config.min_parameters = 0
    jit_config.cache_dir = tmp_path
    jit_config.strategy = OneBackendStrategy(make_backend())
    net = make_net()
    eager = eager_twin(net)
    enable()
    x = torch.randn(4, 8)
    with torch.no_grad():
        for _ in range(3):
            net(x)
    node = PatchedModule.of(net)
    assert node is not None and node.state is NodeState.TUNED, PatchedModule.history

    def serving() -> bool:
        dispatcher = node.dispatcher
        return dispatcher is not None and not dispatcher.watch.stale()

    done = run_scenarios(net, net, eager, run_eager=_eager_run, serving=serving, atol=tolerance, rtol=tolerance)
    assert len(done) == len(CHANGES) + 6


def _count_calls(module: torch.nn.Module, counts: list[str]) -> None:
    module.register_forward_hook(lambda *a: counts.append("hook"))


def test_child_hooks_fire_once_per_call_while_recording_tuning_and_after():
    from jit_helpers import CountingBackend, make_mlp

    jit_config.min_parameters = 0
    jit_config.strategy = OneBackendStrategy(CountingBackend())  # runs the module: a probe would fire hooks
    net = make_mlp()
    eager = eager_twin(net)
    hooked = net.blocks[0].fc
    counts: list[str] = []
    _count_calls(hooked, counts)
    enable()
    x = torch.randn(3, 32)
    with torch.no_grad():
        for calls in range(1, 9):
            torch.testing.assert_close(net(x), _eager_run(lambda: eager(x)))
            assert len(counts) == calls, (calls, counts, PatchedModule.history)
    states = {node.path: node.state for node in PatchedModule.walk()}
    # the hooked subtree is not tuned as a whole; the rest is
    assert states["MLP"] is NodeState.EAGER and states["MLP.blocks.0"] is NodeState.EAGER
    assert states["MLP.blocks.1"] is NodeState.TUNED and states["MLP.blocks.0.norm"] is NodeState.TUNED
    assert CountingBackend.builds >= 2


def test_a_hook_added_after_tuning_fires_once_per_call_and_detaches_cleanly():
    from jit_helpers import CountingBackend, make_mlp

    jit_config.min_parameters = 0
    jit_config.strategy = OneBackendStrategy(CountingBackend())
    net = make_mlp()
    enable()
    x = torch.randn(3, 32)
    with torch.no_grad():
        for _ in range(3):
            net(x)
        assert PatchedModule.of(net).state is NodeState.TUNED
        counts: list[str] = []
        handle = net.blocks[1].fc.register_forward_hook(lambda *a: counts.append("hook"))
        infers = CountingBackend.infers
        for calls in range(1, 4):
            net(x)
            assert len(counts) == calls
        assert CountingBackend.infers == infers  # the original module answered
        handle.remove()
        net(x)
        assert len(counts) == 3 and CountingBackend.infers == infers + 1  # the backend serves again


def test_jit_tuned_block_matches_eager_across_twenty_swaps(tmp_path):
    """The LoRA-like swaps of tests/aitune_aot/test_aot_weight_swap.py through the JIT (TorchAO: each refit is a
    re-quantization of a fresh copy)."""
    pytest.importorskip("transformers")
    block = bert_block()
    twin = eager_twin(block)
    jit_config.min_parameters = 0
    jit_config.cache_dir = tmp_path
    jit_config.strategy = OneBackendStrategy(_torchao())
    enable()
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        for _ in range(3):
            block(x)
        node = PatchedModule.of(block)
        assert node is not None and node.state is NodeState.TUNED, PatchedModule.history
        for step in range(SWAPS):
            swap_projections(block, twin, step)
            for _ in range(2):
                with bypassed():
                    want = twin(x)
                torch.testing.assert_close(block(x), want, atol=0.1, rtol=0.1,
                                           msg=lambda m, step=step: f"swap {step}: {m}")
            assert not node.dispatcher.watch.stale()


def test_the_torch_patches_come_off_with_the_jit():
    import gc

    from jit_helpers import CountingBackend, make_mlp

    from aitune_core.backends import module_epoch
    from aitune_jit.switch import disable

    gc.collect()  # watches of earlier tests
    original = torch.nn.Module.__dict__["__setattr__"]
    jit_config.min_parameters = 0
    jit_config.strategy = OneBackendStrategy(CountingBackend())
    net = make_mlp()
    enable()
    with torch.no_grad():
        for _ in range(3):
            net(torch.randn(3, 32))
    assert PatchedModule.of(net).state is NodeState.TUNED and module_epoch.installed()
    disable()
    assert not module_epoch.installed()  # no garbage collection needed
    assert torch.nn.Module.__dict__["__setattr__"] is original
