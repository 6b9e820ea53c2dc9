"""refit_backend / Backend.refit: a baked-weight backend is rebuilt from its module; failures leave it as it was."""

from __future__ import annotations

import pytest
import torch

from aitune_core.backends.backend import Backend
from aitune_core.backends.refit import refit_backend
from aitune_core.errors import BackendStateError
from aitune_core.recording.sample import Sample


class _Baking(Backend):
    """Copies the module's weights at build time (like an exported graph)."""

    fail = False

    @property
    def bakes_weights(self) -> bool:
        return True

    def _build(self, module, graph_spec, data, cache_dir) -> None:
        if _Baking.fail:
            raise RuntimeError("cannot rebuild")
        self.weight = module.weight.detach().clone()
        self.cache_dir = cache_dir

    def _infer(self, x):
        return x @ self.weight.T


def _built(tmp_path) -> tuple[torch.nn.Linear, _Baking]:
    module = torch.nn.Linear(3, 3, bias=False)
    x = torch.randn(2, 3)
    backend = _Baking()
    backend.build(module, None, [Sample.capture((x,), {})], torch.device("cpu"), tmp_path)
    return module, backend


def test_refit_rebuilds_from_the_current_weights_in_alternating_folders(tmp_path):
    _Baking.fail = False
    module, backend = _built(tmp_path)
    with torch.no_grad():
        module.weight.mul_(0)
    x = torch.randn(2, 3)
    assert backend.infer(x).abs().sum() > 0  # stale until refit
    assert refit_backend(backend)
    assert backend.infer(x).abs().sum() == 0
    assert backend.cache_dir == tmp_path / "refit"
    assert refit_backend(backend) and backend.cache_dir == tmp_path


def test_a_failed_refit_keeps_the_backend_and_says_false(tmp_path):
    _Baking.fail = False
    _module, backend = _built(tmp_path)
    before = backend.weight
    _Baking.fail = True
    try:
        assert not refit_backend(backend)
    finally:
        _Baking.fail = False
    assert backend.weight is before and backend.is_active


def test_refit_needs_an_active_backend_built_in_this_process(tmp_path):
    from aitune_core.backends.onnxruntime import ONNXRuntimeBackend
    from aitune_core.backends.torch_eager import TorchEagerBackend
    from aitune_core.backends.torch_inductor import TorchInductorBackend

    assert ONNXRuntimeBackend().bakes_weights and _Baking().bakes_weights
    assert not TorchEagerBackend().bakes_weights and not TorchInductorBackend().bakes_weights
    with pytest.raises(BackendStateError, match="needs ACTIVE"):
        _Baking().refit()
    _module, backend = _built(tmp_path)
    backend._refit_inputs = None
    with pytest.raises(BackendStateError, match="nothing to refit"):
        backend.refit()
