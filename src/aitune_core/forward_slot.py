"""`ForwardSlot`: the one way aitune routes a module's calls - an instance attribute `forward`, installed and removed.

Why: both callers need the same thing. The JIT node of a RECORDING or TUNED module and the AOT `Module` wrapper
both put an object at `module.__dict__["forward"]`, so that `Module.__call__` - untouched, with the user's pre- and
post-hooks around it - calls aitune's routing instead of the class's forward. Getting that object right is
subtle, and used to be done twice:

- `inspect.signature(module.forward)` must still show the user's signature (`__wrapped__`), and attributes such as
  `forward.__func__` / `__self__` / `__name__` must still resolve;
- copying or pickling the module must yield the original forward bound to the copy - through stdlib callables
  only, so a pickle taken while aitune is on loads where aitune is not installed;
- while dynamo traces the module (a user's `torch.compile` of a model aitune is recording), the original forward
  runs, never the routing; so it does while a `TorchDispatchMode` is active (`FakeTensorMode` in a shape or memory
  estimator, `FlopCounterMode`) or a tensor argument is of a subclass (a fake tensor, a `DTensor`, a
  `__torch_function__` or bare `as_subclass` type): the mode or subclass must see every operation, a compiled
  kernel handed fake tensors crashed the process, and compiled code handed another subclass failed at run time
  and left the graph eager for good; so it does for a call with a tensor on the `meta` device (a shape check
  before `to_empty`: recorded, such calls failed the tuning, "Tensor.item() cannot be called on meta tensors") or
  a sparse one (compiled code failed on it), under a forward-AD level (`torch.autograd.forward_ad.dual_level`:
  compiled code failed on dual tensors), and under a `TorchFunctionMode` of the program's (it saw aitune's own
  reads of the arguments' `device` and `dim`; the device context of `torch.device(...)` and
  `torch.set_default_device` does not count);
- removal must put back exactly what was there (an instance `forward` the user set, or nothing), and only if the
  slot is still ours;
- a raw copy of the module's `__dict__` (`new.__dict__.update(old.__dict__)`, a replica made by assigning a copied
  `__dict__`) carries the wrapper: a call through torch's `_call_impl` whose `self` is not the slot's module but
  shares its parameter table takes it out of the copy and runs the copy's own forward (`strip_foreign`; it cost
  0.8 us a call on this CPU, reading the caller's frame); before, every call of the copy ran the original module
  (a silent wrong answer). A module whose own `forward` was set to the watched one's (`w.forward = m.forward`)
  keeps it and is routed as before;
- a program that replaces the forward after the slot is installed - assigns a new function to the class's
  `forward` (a monkeypatch) or swaps the module's `__class__` - gets the new forward: the slot bound the old one,
  and an instance attribute would shadow the class's new one for good (a wrong answer). Each call compares the
  module's class and its class's `forward` with those seen at install (two identity checks); on a change the
  slot calls the current forward and tells its owner once (`on_change`), which stops routing.

In the style of accelerate's `add_hook_to_module` / `remove_hook_from_module`: `install()` / `remove()` are a
symmetric pair, and the behaviour lives in the `handler(args, kwargs)` each caller passes (the JIT node's
record-or-dispatch, the AOT wrapper's route). `ForwardSlot.of(module)` finds the slot of a module and its `owner`.
"""

from __future__ import annotations

import copy
import logging
import sys
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.autograd.forward_ad as _forward_ad
import torch.utils._device

_MISSING: Any = object()
_is_compiling = torch.compiler.is_compiling
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._len_torch_function_stack
_DeviceContext = torch.utils._device.DeviceContext
_STRIDED = torch.strided
_TENSOR = torch.Tensor
_PLAIN_TYPES = frozenset({torch.Tensor, torch.nn.Parameter, type(None), bool, int, float, str, tuple, list, dict})
_CALL_IMPL_CODE = torch.nn.Module._call_impl.__code__  # (the frame that calls `self.forward` for `Module.__call__`)

Handler = Callable[[tuple, dict], Any]
ChangeHandler = Callable[[str], "bool | None"]
_logger = logging.getLogger("aitune")


def _tensor_subclass(value: Any) -> bool:
    """Whether `value` is a tensor of a class of its own (FakeTensor, DTensor, a `__torch_function__` subclass, a
    bare `as_subclass` type): compiled code handed one failed at run time and left the graph eager for good."""
    cls = type(value)
    return cls not in _PLAIN_TYPES and issubclass(cls, torch.Tensor)


def _odd_tensor(value: Any) -> bool:
    """A plain tensor that compiled code does not take: on the `meta` device, or sparse."""
    return value.is_meta or value.layout is not _STRIDED


def _user_function_mode() -> bool:
    """A `TorchFunctionMode` of the program's is active (not the device context `torch.device(...)` and
    `torch.set_default_device` push): it must see the forward's own calls, and none of aitune's."""
    if not _function_modes():
        return False
    return any(type(mode) is not _DeviceContext for mode in torch.overrides._get_current_function_mode_stack())


def must_run_original(args: tuple, kwargs: dict) -> bool:
    """A call only the module's own forward may answer: dynamo traces it, a dispatch mode, a function mode of the
    program's or a forward-AD level is active, or an argument is a tensor subclass, a meta or a sparse tensor (see
    the module docstring). A type check per argument on the common path."""
    if _is_compiling() or _dispatch_modes() or _forward_ad._current_level >= 0 or _user_function_mode():
        return True
    for value in args:
        cls = type(value)
        if cls is _TENSOR:
            if _odd_tensor(value):
                return True
        elif cls not in _PLAIN_TYPES and _tensor_subclass(value):
            return True
    if kwargs:
        for value in kwargs.values():
            cls = type(value)
            if cls is _TENSOR:
                if _odd_tensor(value):
                    return True
            elif cls not in _PLAIN_TYPES and _tensor_subclass(value):
                return True
    return False


class SlotForward:
    """The object at `module.__dict__["forward"]` while a slot is installed (see the module docstring).

    No `__slots__`: dynamo guards on the `__dict__` of objects it traces through.
    """

    def __init__(self, slot: ForwardSlot) -> None:
        self._slot = slot
        self.__wrapped__ = slot.original
        # what `help(module.forward)` and `inspect.getdoc` show: the user's (the class attributes are this class's)
        self.__doc__ = getattr(slot.original, "__doc__", None)
        self.__module__ = getattr(slot.original, "__module__", None)

    def __eq__(self, other: object) -> bool:  # `module.forward == type(module).forward.__get__(module)`, as unwatched
        return other is self or self.__wrapped__ == other

    def __hash__(self) -> int:
        return hash(self.__wrapped__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        slot = self._slot
        if must_run_original(args, kwargs):  # dynamo traces the module's own forward, never aitune's routing
            return slot.original(*args, **kwargs)
        caller = sys._getframe(1)
        if caller.f_code is _CALL_IMPL_CODE:
            called = caller.f_locals.get("self")
            if called is not slot.module and _raw_copy(called, slot.module):
                return _copy_call(called, args, kwargs)  # (`strip_foreign`)
        code = slot.code
        if code is not None:
            module = slot._module_ref()
            if module is not None and ((cls := type(module)) is not code[0] or cls.forward is not code[1]) and (
                    cls is not code[0] or class_forward(cls) is not code[2]):  # (a descriptor's reads are new)
                return slot.changed_call(module, args, kwargs)
        return slot.handler(args, kwargs)

    def __getattr__(self, name: str) -> Any:  # forward.__func__, forward.__self__, forward.__name__, ...
        if name in ("__wrapped__", "_slot") or name.startswith("__getstate"):
            raise AttributeError(name)
        return getattr(self.__wrapped__, name)

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        # `getattr(module, "forward")` runs while the copy's __dict__ is still empty: it binds the class's forward
        # to the copy. A forward the user had set on the instance is copied as it was.
        slot = self._slot
        if slot.saved is not _MISSING and slot.saved is not None:
            return (copy.copy, (slot.saved,))
        return (getattr, (slot.module, "forward"))

    def __repr__(self) -> str:
        return f"<aitune forward of {self._slot.label}>"


def class_forward(cls: type) -> Any:
    """`forward` as `cls` defines it, not read through its descriptor: a function, or the descriptor object that
    `cls.forward` would call (a `functools.partialmethod` or a decorator class returns a new object at each read,
    so comparing reads said the forward had changed at every call; a helper's script, sixth round)."""
    for klass in cls.__mro__:
        if "forward" in klass.__dict__:
            return klass.__dict__["forward"]
    return None


def bound_forward(module: torch.nn.Module) -> Callable[..., Any]:
    """The class's current forward for `module`, as `module.forward` reads it without an instance attribute: bound
    through its descriptor (a `functools.partial` in the class has none: it is called as it is)."""
    cls = type(module)
    raw = class_forward(cls)
    get = getattr(type(raw), "__get__", None)
    return get(raw, module, cls) if get is not None else raw


class ForwardSlot:
    """Routes `module`'s calls to `handler(args, kwargs)` while installed.

    Args:
        module: the module (held weakly: a slot never keeps a model alive).
        handler: called with `(args, kwargs)` of every call while installed (not while dynamo traces).
        owner: the object the slot belongs to, for `ForwardSlot.of(module).owner` (the AOT wrapper).
        label: how the slot names itself in reprs.
        on_change: called (with what changed) when the module's class or its class's forward is no longer the one
            seen at install (see the module docstring); the call itself runs the current forward. It is called
            again at later calls while it returns False (it could not act yet), never after it returned otherwise.
    """

    def __init__(self, module: torch.nn.Module, handler: Handler, *, owner: Any = None, label: str = "",
                 on_change: ChangeHandler | None = None) -> None:
        self._module_ref = weakref.ref(module)
        self.saved: Any = module.__dict__.get("forward", _MISSING)  # an instance forward the user had set
        self.original: Callable[..., Any] = module.forward  # the forward aitune falls back to
        cls = type(module)
        # what `original` was bound from; None when the user's instance forward is (class changes don't reach it)
        # (and the class attribute itself: a descriptor - `functools.partialmethod`, a decorator class - can return
        # a new object at each read)
        self.code: tuple[type, Any, Any] | None = (
            (cls, cls.forward, class_forward(cls)) if self.saved is _MISSING else None)
        self.handler = handler
        self.owner = owner
        self.label = label or cls.__name__
        self.on_change = on_change
        self.changed: str | None = None
        self.routine_change = False  # the change is a library's routine class swap (`_what_changed`)
        self._change_taken = False
        self.wrapper = SlotForward(self)

    @property
    def module(self) -> torch.nn.Module | None:
        return self._module_ref()

    @property
    def installed(self) -> bool:
        module = self.module
        return module is not None and module.__dict__.get("forward") is self.wrapper

    def install(self) -> ForwardSlot:
        module = self.module
        if module is not None:
            module.__dict__["forward"] = self.wrapper
        return self

    def remove(self) -> None:
        """Put back what was there before `install()`, if the slot is still ours (idempotent)."""
        module = self.module
        if module is None or module.__dict__.get("forward") is not self.wrapper:
            return
        if self.saved is _MISSING:
            del module.__dict__["forward"]
        else:
            module.__dict__["forward"] = self.saved

    @contextmanager
    def suspended(self) -> Iterator[torch.nn.Module | None]:
        """The module with its own forward for the block (strategies and backends see the user's module)."""
        was_installed = self.installed
        self.remove()
        try:
            yield self.module
        finally:
            if was_installed:
                self.install()

    def changed_call(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
        """A call after the forward changed: the owner hears of it (`on_change`), the module's current forward
        answers."""
        if not self._change_taken:
            if self.changed is None:
                self.changed = self._what_changed(module)
            taken: bool | None = True
            if self.on_change is not None:
                try:
                    taken = self.on_change(self.changed)
                except Exception:  # the owner's clean-up failing must not fail the program's call
                    _logger.debug("on_change of %s failed", self.label, exc_info=True)
            self._change_taken = taken is not False
        return bound_forward(module)(*args, **kwargs)

    def _what_changed(self, module: torch.nn.Module) -> str:
        old_cls = self.code[0] if self.code is not None else type(module)
        now = type(module)
        if now is not old_cls:
            # a library's own swap (torch.nn.utils.parametrize makes `ParametrizedLinear`): a subclass, same forward
            self.routine_change = (issubclass(now, old_cls) and class_forward(now) is self.code[2]
                                   if self.code else False)
            how = " (a subclass with the same forward)" if self.routine_change else ""
            return f"its class changed from {old_cls.__qualname__} to {now.__qualname__}{how}"
        return f"{now.__qualname__}.forward was replaced"

    def state_without(self, state: dict[str, Any]) -> dict[str, Any]:
        """`state` (a copy of the module's `__dict__`) as it would be without this slot installed."""
        if state.get("forward") is self.wrapper:
            if self.saved is _MISSING:
                del state["forward"]
            else:
                state["forward"] = self.saved
        return state

    @staticmethod
    def of(module: Any) -> ForwardSlot | None:
        """The slot installed on `module`, else None."""
        forward = getattr(module, "__dict__", {}).get("forward")
        return forward._slot if isinstance(forward, SlotForward) else None


def _raw_copy(module: Any, original: Any) -> bool:
    """`module` shares the parameter table of `original`: its `__dict__` was copied from the original's (a module
    whose own `forward` attribute was set to another module's - `wrapper.forward = inner.forward` - has its own)."""
    state = getattr(module, "__dict__", None)
    return (state is not None and original is not None
            and state.get("_parameters") is original.__dict__.get("_parameters"))


def _copy_call(module: Any, args: tuple, kwargs: dict) -> Any:
    """A call of a module that holds another module's wrapper: the wrapper comes out, and its own forward runs."""
    strip_foreign(module)
    return module.forward(*args, **kwargs)


def strip_foreign(module: torch.nn.Module) -> bool:
    """Take out of `module.__dict__` a slot's wrapper that belongs to another module, putting back what that
    module had there before the slot (an instance forward of the user's, or nothing). A raw copy of a module's
    `__dict__` (`new.__dict__.update(old.__dict__)`, `new.__dict__ = old.__dict__.copy()`) carries the wrapper,
    which routes every call of the copy to the old module: the copy's own attributes and class went unseen (a
    helper's script: a scale set on the copy was ignored, a subclass's forward never ran). True when it took one."""
    wrapper = module.__dict__.get("forward")
    if not isinstance(wrapper, SlotForward) or wrapper._slot.module is module:
        return False
    saved = wrapper._slot.saved
    if saved is _MISSING:
        module.__dict__.pop("forward", None)  # (another thread's call of the copy may have taken it already)
    else:
        module.__dict__["forward"] = saved
    return True
