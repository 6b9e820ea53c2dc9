"""End to end with the default strategy (FirstWinsStrategy([TorchInductorBackend()])): the one Inductor test."""

import pytest
import torch
from aot_models import build

import aitune.torch as ait
from aitune_core.backends.torch_inductor import TorchInductorBackend


@pytest.mark.slow
def test_default_strategy_tunes_with_inductor_saves_and_loads(tmp_path):
    model = build()
    reference = build()
    calls = []
    model.encoder.register_forward_hook(lambda m, args, out: calls.append(out.shape[0]))
    model.encoder = ait.Module(model.encoder, "enc")
    torch.manual_seed(0)
    ait.tune(model, [torch.randn(8) for _ in range(8)], batch_sizes=[1, 4])

    ((_, backend),) = model.encoder.backends
    assert isinstance(backend, TorchInductorBackend)
    x = torch.randn(3, 8)  # never recorded; inside the tuned batch range
    calls.clear()
    with torch.no_grad():
        assert torch.allclose(model(x), reference(x), atol=1e-5)
        assert torch.allclose(model(x), reference(x), atol=1e-5)  # again, with the routing installed
    assert calls == [3, 3]  # the hook fired once per call, not inside the compiled graph

    ait.save(model, tmp_path / "ckpt")
    loaded = build(seed=1)
    loaded.encoder = ait.Module(loaded.encoder, "enc2")
    ait.load(loaded, tmp_path / "ckpt")
    ((_, restored),) = loaded.encoder.backends
    assert isinstance(restored, TorchInductorBackend) and restored.state.value == "deployed"
    with torch.no_grad():  # only the encoder was wrapped and saved; the head keeps its seed-1 weights
        assert torch.allclose(loaded.encoder(x), reference.encoder(x), atol=1e-5)
