import pytest
import torch
from core_fakes import TinyMLP, record

from aitune_core.backends.backend import BackendState
from aitune_core.backends.torch_eager import TorchEagerBackend, TorchEagerBackendConfig


def test_eager_runs_the_original_module_with_hooks(tmp_path):
    model = TinyMLP().eval()
    spec, data = record(model)
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    backend = TorchEagerBackend().build(model, spec, data, torch.device("cpu"), tmp_path)
    assert backend.is_jit
    assert calls == []  # building runs nothing
    x = torch.randn(3, 8)
    assert torch.equal(backend.infer(x), model(x))
    assert len(calls) == 2
    assert backend.describe() == "TorchEagerBackend()"


def test_eager_checkpoint_round_trip(tmp_path):
    model = TinyMLP().eval()
    spec, data = record(model)
    state = TorchEagerBackend(TorchEagerBackendConfig()).build(model, spec, data, "cpu", tmp_path).to_dict()
    loaded = TorchEagerBackend.from_dict(model, state)
    assert loaded.state is BackendState.CHECKPOINT_LOADED
    loaded.deploy()
    x = torch.randn(2, 8)
    assert torch.equal(loaded.infer(x), model(x))
    with pytest.raises(ValueError, match="original module"):
        TorchEagerBackend.from_dict(None, state)
