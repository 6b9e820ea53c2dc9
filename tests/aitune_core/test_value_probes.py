"""aitune_core/validation/value_probes.py: a backend that exports one trace must follow a padded mask that the
recorded calls (all ones) never showed; a backend that follows it, and a module that refuses padding, pass."""

from __future__ import annotations

import pytest
import torch

from aitune_aot.module import Module, ModuleState
from aitune_aot.tune import tune
from aitune_core.backends.torch_eager import TorchEagerBackend
from aitune_core.errors import TuningFailedError, ValidationError
from aitune_core.strategies.one_backend import OneBackendStrategy


class _MaskedMean(torch.nn.Module):
    """Mean of the positions its attention mask keeps (a left-padded batch shifts nothing else)."""

    def __init__(self, strict: bool = False) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.strict = strict

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.strict and not bool(mask.all()):
            raise ValueError("this model takes no padding")
        keep = mask.unsqueeze(-1).to(x.dtype)
        return (self.proj(x) * keep).sum(1) / keep.sum(1)


class _Exporting(TorchEagerBackend):
    """Stands for an exporting backend (ONNX Runtime, TensorRT): probed after validation."""

    @property
    def exports_graph(self) -> bool:
        return True


class _BakedMask(_Exporting):
    """An exported graph that took the traced mask's values as constants: it never sees padding."""

    def _infer(self, *args, **kwargs):
        return super()._infer(args[0], torch.ones_like(args[1]))


def _samples() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [(torch.randn(6, 8, generator=generator), torch.ones(6, dtype=torch.long)) for _ in range(3)]


def _tuned(backend, strict: bool = False) -> Module:
    module = Module(_MaskedMean(strict).eval(), "masked")
    tune(module, _samples(), batch_sizes=[2], strategy=OneBackendStrategy(backend))
    return module


def test_a_graph_that_baked_an_all_ones_mask_fails_validation():
    with pytest.raises((TuningFailedError, ValidationError), match="ignores values its recorded calls never varied"):
        _tuned(_BakedMask())


def test_a_backend_that_follows_the_mask_and_a_module_that_refuses_padding_are_tuned():
    assert _tuned(_Exporting()).state is ModuleState.TUNED
    assert _tuned(_BakedMask(), strict=True).state is ModuleState.TUNED, "no probe the module itself refuses"


def test_backends_that_do_not_export_are_not_probed():
    class Baked(TorchEagerBackend):
        def _infer(self, *args, **kwargs):
            return super()._infer(args[0], torch.ones_like(args[1]))

    assert _tuned(Baked()).state is ModuleState.TUNED  # (dynamo-compiled backends guard what they specialise)
