"""Methods of `torch.nn.Module` that return `self`, made to return the AOT wrapper instead.

Why: `model = ait.Module(m).to(device).eval()` must leave `model` the wrapper. The wrapper is a transparent proxy,
so `.to(...)` would otherwise run on the wrapped module and hand back the raw module, silently dropping aitune.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: torch.nn.Module methods that return `self`
CHAINABLE = (
    "to", "cuda", "cpu", "type", "float", "double", "half", "bfloat16",
    "train", "eval", "requires_grad_", "apply", "to_empty", "share_memory",
)


def _chainable(method_name: str) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = getattr(self.__wrapped__, method_name)(*args, **kwargs)
        return self if result is self.__wrapped__ else result

    method.__name__ = method_name
    method.__qualname__ = f"Module.{method_name}"
    method.__doc__ = f"`torch.nn.Module.{method_name}` of the wrapped module; returns this wrapper, not the module."
    return method


def install_chainable_methods(cls: type) -> None:
    """Give the proxy class `cls` the chainable methods (each calls the wrapped module's and returns the proxy)."""
    for name in CHAINABLE:
        setattr(cls, name, _chainable(name))
