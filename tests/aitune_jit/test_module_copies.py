"""module_copies: copies and pickles of a module aitune watches carry nothing of aitune's."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from jit_helpers import CountingBackend, make_mlp, run

from aitune_jit import module_copies
from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.runtime import NODE_ATTR
from aitune_jit.state import NodeState
from aitune_jit.switch import enable


class Scaled(torch.nn.Module):
    """A plain attribute that a copy may change."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)
        self.alpha = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x)) * self.alpha


def _watched(model: torch.nn.Module, min_samples: int) -> PatchedModule:
    jit_config.backends = [CountingBackend()]
    jit_config.min_parameters = 0
    jit_config.detect_graph_breaks = False
    jit_config.min_samples = min_samples
    enable()
    run(model, [2, 3])
    node = PatchedModule.of(model)
    assert node is not None and "forward" in model.__dict__
    return node


class OwnState(Scaled):
    """A class with a `__getstate__` of its own, the common pattern: it bypasses torch's (and aitune's)."""

    def __getstate__(self):
        state = self.__dict__.copy()
        state.pop("cache", None)
        return state


@pytest.mark.parametrize("cls", [Scaled, OwnState])
def test_a_shallow_copy_computes_with_its_own_attributes_recording_or_tuned(cls) -> None:
    """`OwnState`'s own `__getstate__` bypasses torch's: the copy's rebuild (`__setstate__`) drops aitune's parts."""
    for min_samples, state in ((100, NodeState.RECORDING), (2, NodeState.TUNED)):
        torch.manual_seed(0)
        model = cls().eval()
        assert _watched(model, min_samples).state is state
        clone = copy.copy(model)
        clone.alpha = 50.0
        x = torch.randn(2, 32)
        with torch.no_grad():
            torch.testing.assert_close(clone(x), model(x) * 50.0)
        assert NODE_ATTR not in clone.__dict__ or PatchedModule.of(clone) is not PatchedModule.of(model)
        assert "forward" not in clone.__dict__ or clone.__dict__["forward"] is not model.__dict__["forward"]


def test_a_deep_copy_has_its_own_weights_and_its_own_node() -> None:
    model = make_mlp()
    _watched(model, 100)
    clone = copy.deepcopy(model)
    with torch.no_grad():
        clone.head.weight.add_(1.0)
    x = torch.randn(3, 32)
    with torch.no_grad():
        assert not torch.allclose(clone(x), model(x))
    assert PatchedModule.of(clone) is not None and PatchedModule.of(clone) is not PatchedModule.of(model)


def test_a_whole_module_pickle_loads_with_weights_only_and_the_modules_classes_allowed() -> None:
    torch.manual_seed(0)
    model = Scaled().eval()
    _watched(model, 2)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    with torch.serialization.safe_globals([Scaled, torch.nn.Linear]):
        loaded = torch.load(buffer, weights_only=True)  # no builtins.getattr, no NoneType in the pickle
    assert NODE_ATTR not in loaded.__dict__ and "forward" not in loaded.__dict__
    x = torch.randn(2, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x), rtol=1e-5, atol=1e-6)
    assert b"aitune" not in pickle.dumps(model)


def test_a_users_own_instance_forward_is_what_the_copy_gets() -> None:
    torch.manual_seed(0)
    model = Scaled().eval()
    model.forward = model.forward  # an instance forward set by the program (a bound method of its class)
    _watched(model, 100)
    state = model.__getstate__()
    assert state["forward"] == model.__dict__["forward"]._slot.saved and NODE_ATTR not in state


def test_installed_with_the_hook_and_torchs_own_afterwards() -> None:
    from aitune_jit.switch import disable

    original, restore = torch.nn.Module.__getstate__, torch.nn.Module.__setstate__
    enable()
    assert module_copies.installed() and torch.nn.Module.__getstate__ is not original
    assert torch.nn.Module.__setstate__ is not restore
    disable()
    assert not module_copies.installed() and torch.nn.Module.__getstate__ is original
    assert torch.nn.Module.__setstate__ is restore


def test_a_data_parallel_replica_runs_its_own_weights_recording_or_tuned() -> None:
    """`nn.DataParallel` replicates the module tree with `_replicate_for_data_parallel` (a copy of the instance dict)
    and gives each replica its device's weights; a replica that kept the original's slot ran the original."""
    for min_samples, state in ((100, NodeState.RECORDING), (2, NodeState.TUNED)):
        torch.manual_seed(0)
        model = Scaled().eval()
        assert _watched(model, min_samples).state is state
        replica = model._replicate_for_data_parallel()
        replica.lin = model.lin._replicate_for_data_parallel()
        replica.lin._parameters = {}  # (as `replicate()` does: the replica's weights are plain tensors of its own)
        replica.lin.weight, replica.lin.bias = model.lin.weight.detach() * 2, model.lin.bias.detach() * 2
        assert NODE_ATTR not in vars(replica) and "forward" not in vars(replica)  # a module aitune has not seen
        x = torch.randn(2, 32)
        with torch.no_grad():
            expected = torch.tanh(torch.nn.functional.linear(x, replica.lin.weight, replica.lin.bias))
            torch.testing.assert_close(replica(x), expected)
