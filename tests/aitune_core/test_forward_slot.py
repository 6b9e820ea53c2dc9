"""ForwardSlot: routes a module's calls while installed; signature, copies, pickles and removal stay right."""

from __future__ import annotations

import copy
import inspect
import pickle

import torch

from aitune_core.forward_slot import ForwardSlot


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.fc(x) * scale


def test_calls_go_to_the_handler_and_hooks_still_fire_around_it():
    net = Net()
    seen, fired = [], []
    net.register_forward_hook(lambda module, args, out: fired.append(1))
    slot = ForwardSlot(net, lambda args, kwargs: seen.append((args, kwargs)) or slot.original(*args, **kwargs))
    slot.install()
    x = torch.randn(2, 4)
    torch.testing.assert_close(net(x, scale=2.0), Net.forward(net, x, 2.0))
    assert len(seen) == 1 and seen[0][1] == {"scale": 2.0} and fired == [1]
    assert ForwardSlot.of(net) is slot and slot.installed


def test_the_signature_and_bound_attributes_are_the_users():
    net = Net()
    ForwardSlot(net, lambda args, kwargs: None).install()
    assert list(inspect.signature(net.forward).parameters) == ["x", "scale"]
    assert net.forward.__self__ is net and net.forward.__name__ == "forward"


def test_copies_and_pickles_get_the_original_forward():
    net = Net()
    ForwardSlot(net, lambda args, kwargs: "routed").install()
    for clone in (copy.deepcopy(net), pickle.loads(pickle.dumps(net))):
        assert ForwardSlot.of(clone) is None
        x = torch.randn(1, 4)
        torch.testing.assert_close(clone(x), Net.forward(clone, x))


def test_remove_restores_an_instance_forward_the_user_had_set_and_is_idempotent():
    net = Net()
    own = lambda x, scale=1.0: x  # noqa: E731
    net.forward = own
    slot = ForwardSlot(net, lambda args, kwargs: "routed").install()
    assert net(torch.ones(1)) == "routed"
    slot.remove()
    slot.remove()
    assert net.__dict__["forward"] is own


def test_remove_leaves_a_newer_forward_in_place():
    net = Net()
    slot = ForwardSlot(net, lambda args, kwargs: "routed").install()
    newer = lambda *a, **k: "newer"  # noqa: E731
    net.__dict__["forward"] = newer
    slot.remove()
    assert net.__dict__["forward"] is newer


def test_suspended_shows_the_users_forward_for_the_block_only():
    net = Net()
    slot = ForwardSlot(net, lambda args, kwargs: "routed", owner="owner").install()
    with slot.suspended() as module:
        assert module is net and ForwardSlot.of(net) is None
        assert isinstance(net(torch.ones(1, 4)), torch.Tensor)
    assert net(torch.ones(1, 4)) == "routed" and ForwardSlot.of(net).owner == "owner"
