"""aitune_core/backends/tensor_swaps.py: `torch.utils.swap_tensors` works on tensors a module snapshot watches,
and the snapshot then reads as changed."""

from __future__ import annotations

import weakref

import pytest
import torch

from aitune_core.backends import module_watch, tensor_swaps
from aitune_core.backends.module_watch import ModuleSnapshot


@pytest.fixture
def installed():
    tensor_swaps.uninstall()
    yield
    tensor_swaps.uninstall()


def test_a_watched_weight_can_be_swapped_and_the_snapshot_sees_a_change(installed):
    net = torch.nn.Linear(4, 4)
    before = ModuleSnapshot.take(net)  # (installs the patch: its weak references would stop the swap)
    assert tensor_swaps.installed() and weakref.getweakrefcount(net.weight) > 0
    new = torch.nn.Parameter(torch.zeros(4, 4))
    torch.utils.swap_tensors(net.weight, new)
    assert torch.equal(net.weight, torch.zeros(4, 4))
    assert not before.same_weights(ModuleSnapshot.take(net))


def test_swap_on_conversion_converts_a_watched_module(installed):
    net = torch.nn.Linear(4, 4)
    ModuleSnapshot.take(net)
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        net.double()
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)
    assert net.weight.dtype == torch.float64


def test_weak_references_of_others_still_stop_the_swap_as_plainly(installed):
    net = torch.nn.Linear(4, 4)
    ModuleSnapshot.take(net)
    kept = weakref.ref(net.weight)  # the program's own
    with pytest.raises(RuntimeError, match="weakref"):
        torch.utils.swap_tensors(net.weight, torch.nn.Parameter(torch.zeros(4, 4)))
    assert kept() is net.weight


def test_forget_replaces_only_the_named_tensors(installed):
    net = torch.nn.Linear(4, 4)
    snapshot = ModuleSnapshot.take(net)
    module_watch.forget_tensors(net.weight)
    live = snapshot.live_tensors()
    assert live[0] is None and live[1] is net.bias


def test_a_memo_entry_is_dropped_from_its_dictionary_without_a_heap_scan(installed, monkeypatch):
    """A fake-tensor converter's weak-identity memo of the weight (kept alive by a compiled graph) must not stop
    the swap; the memo is found from its reference, and the collector is not run for it."""
    import gc

    from torch.utils.weak import WeakIdKeyDictionary

    net = torch.nn.Linear(4, 4)
    ModuleSnapshot.take(net)
    memo = WeakIdKeyDictionary()
    memo[net.weight] = 1
    monkeypatch.setattr(gc, "get_referrers", lambda *a: pytest.fail("no heap scan"))
    monkeypatch.setattr(tensor_swaps, "_collection_due", lambda: pytest.fail("no collection needed"))
    torch.utils.swap_tensors(net.weight, torch.nn.Parameter(torch.zeros(4, 4)))
    assert len(memo) == 0 and torch.equal(net.weight, torch.zeros(4, 4))
