"""A LoRA-like weight swap: a tuned transformers block whose attention projections change 20 times between calls
answers every call like eager (issue 17, acceptance 2). `benchmarks/probes/weight_swap.py` times the swaps."""

from __future__ import annotations

import copy

import pytest
import torch

from aitune_aot.module import Module, ModuleState
from aitune_aot.tune import tune
from aitune_core.backends.onnxruntime import ONNXRuntimeBackend
from aitune_core.backends.torch_inductor import TorchInductorBackend
from aitune_core.strategies.one_backend import OneBackendStrategy

transformers = pytest.importorskip("transformers")

SWAPS = 20
PROJECTIONS = ("query", "key", "value")


def _block() -> torch.nn.Module:
    from transformers.models.bert.modeling_bert import BertLayer

    config = transformers.BertConfig(hidden_size=32, num_attention_heads=2, intermediate_size=64)
    torch.manual_seed(0)
    return BertLayer(config).eval()


def _swap(block: torch.nn.Module, twin: torch.nn.Module, step: int) -> None:
    """Odd steps assign new Parameters (an adapter swapped in), even steps copy into the weights in place."""
    generator = torch.Generator().manual_seed(100 + step)
    for name in PROJECTIONS:
        weight = getattr(block.attention.self, name).weight
        new = torch.randn(weight.shape, generator=generator) * 0.2
        for target in (block, twin):
            projection = getattr(target.attention.self, name)
            if step % 2:
                projection.weight = torch.nn.Parameter(new.clone(), requires_grad=False)
            else:
                with torch.no_grad():
                    projection.weight.copy_(new)


def _torchao():
    quantization = pytest.importorskip("torchao.quantization")
    from aitune_core.backends.torchao import TorchAOBackend, TorchAOBackendConfig

    return TorchAOBackend(TorchAOBackendConfig(quantization_config=quantization.Int8WeightOnlyConfig(), compile=False))


@pytest.mark.parametrize(
    ("make_backend", "tolerance"),
    [
        pytest.param(_torchao, 0.1, id="torchao"),
        pytest.param(ONNXRuntimeBackend, 1e-4, id="onnxruntime", marks=pytest.mark.slow),  # a re-export per swap
        pytest.param(TorchInductorBackend, 1e-4, id="inductor", marks=pytest.mark.slow),
    ],
)
def test_every_call_matches_eager_across_twenty_swaps(make_backend, tolerance):
    block = _block()
    twin = copy.deepcopy(block)
    wrapped = Module(block, "bert_layer")
    tune(wrapped, [torch.randn(6, 32) for _ in range(2)], batch_sizes=[2], strategy=OneBackendStrategy(make_backend()))
    assert wrapped.state is ModuleState.TUNED
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        for step in range(SWAPS):
            _swap(block, twin, step)
            for _ in range(2):
                torch.testing.assert_close(wrapped(x), twin(x), atol=tolerance, rtol=tolerance,
                                           msg=lambda m, step=step: f"swap {step}: {m}")
            assert not wrapped._self_dispatcher.watch.stale()  # the backend serves again after each swap
