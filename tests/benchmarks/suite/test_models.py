"""benchmarks/suite/models.py: deterministic factories fed real (seeded, non-zero) data."""

from __future__ import annotations

import pytest
import torch

from benchmarks.suite import models


@pytest.mark.parametrize("name", ["tiny_resnet", "tiny_vit"])
def test_tiny_models_are_deterministic_and_fed_real_data(name):
    a, b = models.build(name, 2), models.build(name, 2)
    assert models.weights_checksum(a.module) == models.weights_checksum(b.module)
    x = a.make_inputs(0)
    assert torch.equal(x.args[0], b.make_inputs(0).args[0])
    assert not torch.equal(x.args[0], a.make_inputs(1).args[0])
    assert x.args[0].abs().sum() > 0
    with torch.no_grad():
        out = models.primary_output(a.module(*x.args, **x.kwargs))
    assert out.shape == (2, 10)


def test_primary_output_picks_first_tensor():
    t = torch.ones(1)
    assert models.primary_output(t) is t
    assert models.primary_output((None, t)) is t
    assert models.primary_output({"last_hidden_state": t, "pooler": torch.zeros(1)}) is t
    with pytest.raises(TypeError):
        models.primary_output("text")


def test_unknown_model_is_an_error():
    with pytest.raises(ValueError, match="unknown model"):
        models.build("nope", 1)


def test_caller_unpacks_the_batch_and_applies_bf16_autocast():
    seen = {}

    def target(*args, **kwargs):
        seen.update(args=args, kwargs=kwargs, autocast=torch.is_autocast_enabled("cpu"))
        return torch.ones(1)

    models.caller(target, "cpu")(models.Batch((1,), {"k": 2}))
    assert seen == {"args": (1,), "kwargs": {"k": 2}, "autocast": False}
    models.caller(target, "cpu", "bf16")(models.Batch())
    assert seen["autocast"] is True
    with pytest.raises(ValueError):
        models.caller(target, "cpu", "fp8")
