"""ForwardSlot: routes a module's calls while installed; signature, copies, pickles and removal stay right."""

from __future__ import annotations

import copy
import functools
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


def _local_net_class() -> type[Net]:
    class Patchable(Net):  # a class of the test's own: its forward is replaced below
        pass

    return Patchable


def test_a_class_level_forward_patch_is_called_and_the_owner_told_once():
    cls = _local_net_class()
    net = cls()
    handled, told = [], []
    ForwardSlot(net, lambda args, kwargs: handled.append(1) or "routed", on_change=told.append).install()
    x = torch.randn(2, 4)
    assert net(x) == "routed"
    cls.forward = lambda self, x, scale=1.0: self.fc(x) * 2 * scale  # the program patches the class
    for _ in range(2):
        torch.testing.assert_close(net(x), net.fc(x) * 2)
    assert handled == [1] and told == [f"{cls.__qualname__}.forward was replaced"]


def test_a_class_swap_is_seen_and_the_owner_asked_again_until_it_acts():
    net = Net()
    answers = iter([False, True])  # the owner could not act at the first call (another thread compiled)
    told = []

    def on_change(what: str) -> bool:
        told.append(what)
        return next(answers)

    ForwardSlot(net, lambda args, kwargs: "routed", on_change=on_change).install()

    class Swapped(Net):
        def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
            return self.fc(x) - 5

    net.__class__ = Swapped
    x = torch.randn(2, 4)
    for _ in range(3):
        torch.testing.assert_close(net(x), net.fc(x) - 5)
    assert told == ["its class changed from Net to test_a_class_swap_is_seen_and_the_owner_asked_again_until_it_acts."
                    "<locals>.Swapped"] * 2


def test_an_instance_forward_the_user_had_set_is_not_watched_for_class_changes():
    cls = _local_net_class()
    net = cls()
    own = net.forward
    net.forward = lambda x, scale=1.0: own(x, scale) + 1  # the user's instance forward, kept by the slot
    slot = ForwardSlot(net, lambda args, kwargs: "routed", on_change=lambda what: None).install()
    cls.forward = lambda self, x, scale=1.0: self.fc(x) * 0
    assert net(torch.randn(2, 4)) == "routed" and slot.code is None


def test_under_a_dispatch_mode_or_with_a_fake_tensor_the_original_forward_runs():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    net = Net()
    handled = []
    ForwardSlot(net, lambda args, kwargs: handled.append(1) or "routed").install()
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        out = net(mode.from_tensor(torch.randn(2, 4)))
    assert type(out).__name__ == "FakeTensor" and out.shape == (2, 4)
    with FlopCounterMode(display=False) as counter:  # the mode must see the forward's operations
        net(torch.randn(2, 4))
    assert counter.get_total_flops() > 0
    fake = FakeTensorMode(allow_non_fake_inputs=True).from_tensor(torch.randn(2, 4))
    assert type(net(fake)).__name__ == "FakeTensor"  # a fake argument outside its mode's block
    assert handled == []
    assert net(torch.randn(2, 4)) == "routed" and handled == [1]


def test_with_a_meta_tensor_the_original_forward_runs():
    """A shape check on the meta device (before `to_empty`): recorded, such calls failed the tuning for good."""
    net = Net().to("meta")
    handled = []
    ForwardSlot(net, lambda args, kwargs: handled.append(1) or "routed").install()
    out = net(torch.empty(2, 4, device="meta"))
    assert out.is_meta and out.shape == (2, 4) and handled == []
    assert net(x=torch.empty(2, 4, device="meta")).is_meta and handled == []  # (by keyword too)


def test_the_slot_shows_the_users_docstring_module_and_compares_equal_to_the_bound_forward():
    class Documented(Net):
        def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
            """The user's own words."""
            return super().forward(x, scale)

    net = Documented()
    bound = net.forward
    ForwardSlot(net, lambda args, kwargs: "routed").install()
    assert net.forward is not bound and net.forward == bound and hash(net.forward) == hash(bound)
    assert net.forward.__doc__ == "The user's own words." and net.forward.__module__ == Documented.__module__
    assert inspect.getdoc(net.forward) == "The user's own words."


def test_a_raw_copy_of_the_dict_runs_its_own_attributes_and_class_not_the_original():
    class Scaled(Net):
        def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
            return super().forward(x, scale) * 0 + 7

    net = Net()
    routed = []
    slot = ForwardSlot(net, lambda args, kwargs: routed.append(1) or slot.original(*args, **kwargs)).install()
    x = torch.randn(2, 4)
    clone = Net.__new__(Net)
    clone.__dict__.update(net.__dict__)  # (hand-made clone: the slot's wrapper comes along)
    clone.fc = torch.nn.Linear(4, 4)
    torch.testing.assert_close(clone(x), Net.forward(clone, x))
    assert "forward" not in clone.__dict__ and routed == []
    recast = Scaled.__new__(Scaled)
    recast.__dict__ = net.__dict__.copy()  # (re-classing by copying the state)
    assert torch.equal(recast(x), torch.full((2, 4), 7.0))
    net(x)
    assert routed == [1] and ForwardSlot.of(net) is slot  # (the original keeps its slot)


def test_subclass_sparse_forward_ad_and_function_mode_calls_run_the_original_forward():
    """Compiled code failed at run time on a tensor subclass, a sparse tensor and a dual tensor (the graph then
    stayed eager for good), and a program's TorchFunctionMode saw aitune's own reads of the arguments."""
    import torch.autograd.forward_ad as fwad
    from torch.overrides import TorchFunctionMode

    class Tagged(torch.Tensor):
        pass

    class Logged(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            return super().__torch_function__(func, types, args, kwargs or {})

    class Seen(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls: list[str] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.calls.append(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    net = Net()
    handled = []
    ForwardSlot(net, lambda args, kwargs: handled.append(1) or "routed").install()
    x = torch.randn(2, 4)
    assert isinstance(net(x.as_subclass(Tagged)), torch.Tensor)
    assert isinstance(net(x=x.as_subclass(Logged)), torch.Tensor)
    with fwad.dual_level():
        _, tangent = fwad.unpack_dual(net(fwad.make_dual(x, torch.ones(2, 4))))
    assert tangent is not None
    with Seen() as seen:
        net(x)
    assert seen.calls == ["linear", "mul"]  # (the forward's own calls only)
    sparse = Net()
    ForwardSlot(sparse, lambda args, kwargs: handled.append(1) or "routed").install()
    sparse.fc = torch.nn.Identity()
    assert sparse(x.to_sparse()).is_sparse
    assert handled == []
    with torch.device("cpu"):  # (the device context is not a program's mode: routed as usual)
        assert net(x) == "routed"
    assert handled == [1]


def test_a_module_whose_forward_was_set_to_a_watched_modules_forward_keeps_it():
    """Delegation (`wrapper.forward = inner.forward`) is not a copy of the inner module's state."""

    class Wrapper(torch.nn.Module):
        pass

    inner = Net()
    routed = []
    slot = ForwardSlot(inner, lambda args, kwargs: routed.append(1) or slot.original(*args, **kwargs)).install()
    wrapper = Wrapper()
    wrapper.forward = inner.forward
    x = torch.randn(2, 4)
    torch.testing.assert_close(wrapper(x), Net.forward(inner, x))
    assert "forward" in wrapper.__dict__ and routed == [1]


class _Decorator:
    """A method decorator written as a class, as some libraries do: each read binds a new `functools.partial`."""

    def __init__(self, function) -> None:
        self.function = function

    def __get__(self, obj, cls=None):
        return functools.partial(self.function, obj) if obj is not None else functools.partial(self.function)


def _scaled(self, x: torch.Tensor, scale: float) -> torch.Tensor:
    return self.fc(x) * scale


class _PartialMethodNet(Net):
    forward = functools.partialmethod(_scaled, scale=3.0)


class _DecoratedNet(Net):
    @_Decorator
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * 2


def test_a_forward_made_by_a_descriptor_at_each_read_is_not_a_changed_forward():
    # each `cls.forward` read made a new object: every call looked like a replaced forward, and the call then
    # failed ("'functools.partial' object has no attribute '__get__'") - a crash in a helper's script
    for cls, factor in ((_PartialMethodNet, 3.0), (_DecoratedNet, 2.0)):
        net, seen, changes = cls(), [], []
        original = net.forward
        ForwardSlot(net, lambda args, kwargs, s=seen, f=original: s.append(1) or f(*args, **kwargs),
                    on_change=changes.append).install()
        x = torch.randn(2, 4)
        for _ in range(3):
            torch.testing.assert_close(net(x), net.fc(x) * factor)
        assert seen == [1, 1, 1] and changes == [], cls


def test_a_class_forward_replaced_by_a_plain_partial_runs_it_as_it_is():
    cls = _local_net_class()
    net, changes = cls(), []
    slot = ForwardSlot(net, lambda args, kwargs: "routed", on_change=changes.append).install()
    x = torch.randn(2, 4)
    cls.forward = functools.partial(lambda x: x + 1)  # (no `__get__`: `net.forward` is the partial itself)
    torch.testing.assert_close(net(x), x + 1)
    assert changes == [f"{cls.__qualname__}.forward was replaced"] and slot.changed
