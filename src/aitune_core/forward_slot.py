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
  runs, never the routing;
- removal must put back exactly what was there (an instance `forward` the user set, or nothing), and only if the
  slot is still ours.

In the style of accelerate's `add_hook_to_module` / `remove_hook_from_module`: `install()` / `remove()` are a
symmetric pair, and the behaviour lives in the `handler(args, kwargs)` each caller passes (the JIT node's
record-or-dispatch, the AOT wrapper's route). `ForwardSlot.of(module)` finds the slot of a module and its `owner`.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

_MISSING: Any = object()
_is_compiling = torch.compiler.is_compiling

Handler = Callable[[tuple, dict], Any]


class SlotForward:
    """The object at `module.__dict__["forward"]` while a slot is installed (see the module docstring).

    No `__slots__`: dynamo guards on the `__dict__` of objects it traces through.
    """

    def __init__(self, slot: ForwardSlot) -> None:
        self._slot = slot
        self.__wrapped__ = slot.original

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        slot = self._slot
        if _is_compiling():  # dynamo traces the module's own forward, never aitune's routing
            return slot.original(*args, **kwargs)
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


class ForwardSlot:
    """Routes `module`'s calls to `handler(args, kwargs)` while installed.

    Args:
        module: the module (held weakly: a slot never keeps a model alive).
        handler: called with `(args, kwargs)` of every call while installed (not while dynamo traces).
        owner: the object the slot belongs to, for `ForwardSlot.of(module).owner` (the AOT wrapper).
        label: how the slot names itself in reprs.
    """

    def __init__(self, module: torch.nn.Module, handler: Handler, *, owner: Any = None, label: str = "") -> None:
        self._module_ref = weakref.ref(module)
        self.saved: Any = module.__dict__.get("forward", _MISSING)  # an instance forward the user had set
        self.original: Callable[..., Any] = module.forward  # the forward aitune falls back to
        self.handler = handler
        self.owner = owner
        self.label = label or type(module).__name__
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
