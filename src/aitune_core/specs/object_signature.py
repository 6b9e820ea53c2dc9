"""`object_signature(value)`: the layout of the state inside an object argument, as a short stable string.

Why: an object passed to a forward (a transformers `DynamicCache`, a diffusers attention-processor state, a
user's own cache) is neither a tensor nor a container aitune walks, so graph identity used to see only its type:
a prefill call (empty cache) and a decode call (cache holding tensors) of the same module fell into one graph,
with one backend validated on only one of them. The signature describes what is inside - which attributes hold
tensors of which rank and dtype, which are None, how many items a list holds, boolean flags - without sizes or
other numbers (a decode step that grows the cache by one token stays in its graph; its sizes are ranges, as for
any tensor). It is a digest of a bounded walk, deterministic across processes, so it can be stored with a graph.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping
from typing import Any

import torch

#: how deep into nested objects the signature looks, and how many values it visits at most
MAX_DEPTH = 5
MAX_NODES = 1024


class _Walk:
    def __init__(self) -> None:
        self.budget = MAX_NODES
        self.seen: set[int] = set()

    def of(self, value: Any, depth: int) -> Any:
        self.budget -= 1
        if self.budget < 0:
            return "..."
        if isinstance(value, torch.Tensor):
            return ("T", value.dim(), str(value.dtype))
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, (int, float, complex, str, bytes)):
            return type(value).__name__  # sizes and counters change call to call: not part of the layout
        if isinstance(value, (torch.dtype, torch.device, enum.Enum)):
            return repr(value)
        cls = type(value)
        name = f"{cls.__module__}.{cls.__qualname__}"
        if isinstance(value, (torch.nn.Module, type)) or depth >= MAX_DEPTH or id(value) in self.seen:
            return name
        self.seen.add(id(value))
        if isinstance(value, (list, tuple)):
            return (name, len(value), tuple(self.of(item, depth + 1) for item in value))
        if isinstance(value, Mapping):
            try:
                return (name, tuple((repr(k), self.of(v, depth + 1)) for k, v in value.items()))
            except Exception:
                return name
        attributes = getattr(value, "__dict__", None)
        if not isinstance(attributes, dict) or callable(value):
            return name
        return (name, tuple((k, self.of(v, depth + 1)) for k, v in sorted(attributes.items())))


def object_signature(value: Any) -> str:
    """A 12-hex-digit digest of the layout of `value`'s state (see the module docstring)."""
    try:
        layout = _Walk().of(value, 0)
    except Exception:  # an attribute that cannot be read: the type alone
        layout = type(value).__qualname__
    return hashlib.sha1(repr(layout).encode("utf-8", "backslashreplace")).hexdigest()[:12]
