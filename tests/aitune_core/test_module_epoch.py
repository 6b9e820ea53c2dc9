"""module_epoch: the torch patches bump the epoch on every structural change, and come off exactly."""

from __future__ import annotations

import gc

import pytest
import torch
import torch._dynamo.testing
from torch.utils.hooks import RemovableHandle

from aitune_core.backends import module_epoch
from aitune_core.backends.module_epoch import EPOCH


@pytest.fixture
def patched():
    module_epoch.acquire()
    yield
    module_epoch.release()


@pytest.fixture
def watched():
    """Watch the trees of the modules given (`module_epoch.watch_tree`), as a tuned module's watch does."""
    held: list[list[int]] = []

    def watch(module: torch.nn.Module) -> torch.nn.Module:
        held.append(module_epoch.watch_tree(list(module.modules())))
        return module

    yield watch
    for ids in held:
        module_epoch.unwatch_tree(ids)


def _moved(action) -> bool:
    before = EPOCH.value
    action()
    return EPOCH.value != before


def test_patches_are_installed_while_acquired_and_restored_exactly():
    gc.collect()  # watches of earlier tests
    originals = {name: torch.nn.Module.__dict__[name] for name in ("__setattr__", "train", "_apply")}
    remove = RemovableHandle.__dict__["remove"]
    assert not module_epoch.installed()
    module_epoch.acquire()
    module_epoch.acquire()
    assert module_epoch.installed() and torch.nn.Module.__dict__["train"] is not originals["train"]
    module_epoch.release()
    assert module_epoch.installed()  # one user left
    module_epoch.release()
    assert not module_epoch.installed()
    for name, original in originals.items():
        assert torch.nn.Module.__dict__[name] is original
    assert RemovableHandle.__dict__["remove"] is remove
    module_epoch.release()  # an extra release is harmless


def test_structural_changes_move_the_epoch(patched, watched):
    net = watched(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
    handle = None

    def register():
        nonlocal handle
        handle = net[0].register_forward_hook(lambda *a: None)

    assert _moved(register)
    assert _moved(handle.remove)
    assert _moved(lambda: net[0].register_forward_pre_hook(lambda *a: None))
    assert _moved(net.eval)
    assert not _moved(net.eval)  # already in eval mode: nothing changes
    assert _moved(lambda: net.to(torch.float64))
    assert _moved(lambda: net.load_state_dict(net.state_dict()))
    assert _moved(lambda: setattr(net, "1", torch.nn.GELU()))
    assert _moved(lambda: setattr(net[0], "weight", torch.nn.Parameter(torch.zeros(2, 2))))
    assert _moved(lambda: net[0].register_buffer("scale", torch.ones(1)))
    assert _moved(lambda: setattr(net[0], "scale", torch.zeros(1)))  # a registered buffer
    assert _moved(lambda: delattr(net[0], "scale"))
    assert _moved(lambda: torch.nn.modules.module.register_module_forward_hook(lambda *a: None).remove())


def test_plain_attributes_do_not_move_the_epoch(patched):
    net = torch.nn.Linear(2, 2)
    assert not _moved(lambda: setattr(net, "cache", torch.zeros(1)))  # a tensor that is no buffer
    assert not _moved(lambda: setattr(net, "factor", 2.0))
    with torch.no_grad():
        assert not _moved(lambda: net.weight.mul_(2))  # in-place: version counters catch it (ModuleWatch)


def test_a_module_built_inside_a_compiled_forward_moves_nothing_and_compiles_once(patched, watched):
    """transformers' LLaMA slices its ModuleList of layers on every call: traced, the bump would be a side effect
    with a guard on the counter, and every call would compile again."""

    class Sliced(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers[:2]:
                x = layer(x)
            return x

    model = watched(Sliced().eval())
    torch._dynamo.reset()
    counts = torch._dynamo.testing.CompileCounter()
    compiled = torch.compile(model, backend=counts)
    x = torch.randn(2, 4)
    with torch.no_grad():
        compiled(x)
        before = EPOCH.value
        for _ in range(3):
            torch.testing.assert_close(compiled(x), model.layers[1](model.layers[0](x)))
    assert counts.frame_count == 1
    assert EPOCH.value == before
    model(x)  # eagerly, the slice is a new container outside the watched tree: nothing moves either
    assert EPOCH.value == before


def test_setting_a_training_flag_directly_moves_the_epoch_only_when_it_changes(patched, watched):
    drop = watched(torch.nn.Dropout(0.5).eval())
    assert _moved(lambda: setattr(drop, "training", True))  # MC dropout, without `train()`
    assert not _moved(lambda: setattr(drop, "training", True))
    assert _moved(lambda: setattr(drop, "training", False))


def test_changes_outside_the_watched_trees_do_not_move_the_epoch_until_they_are_put_in_one(patched, watched):
    """A forward that slices its ModuleList builds a container on every call (diffusers' mid block, transformers'
    LLaMA): that moved the epoch, and every call of a tuned module that runs such code in Python compared a fresh
    snapshot of its tree."""
    net = watched(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ModuleList([torch.nn.ReLU(), torch.nn.GELU()])))
    assert not _moved(lambda: net[1][1:])  # a new ModuleList, filled with add_module
    loose = torch.nn.Linear(2, 2)
    assert not _moved(lambda: setattr(loose, "weight", torch.nn.Parameter(torch.zeros(2, 2))))
    assert not _moved(lambda: loose.register_buffer("scale", torch.ones(1)))
    assert _moved(lambda: net.append(loose))  # put into the watched tree: a change of a watched module
    assert _moved(lambda: net.to(torch.float64))  # (whole-module methods move it wherever they are called)
