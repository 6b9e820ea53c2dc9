"""Every tensor reachable from a call's arguments or outputs, by path, and exact comparison of tensor values.

Validation needs more than the tensors `specs/tree.py` walks: a backend can write into an argument object it was
handed (a KV cache's `layers[0].keys`), and an output object aitune does not walk (a cache returned with the
logits) can hold tensors the caller keeps. `tensor_slots` therefore also looks into plain objects' attributes
(`__dict__` and `__slots__`), besides tuples, lists and mappings. It never looks into modules (their parameters
are the model, not the call's data), classes, functions or modules of code, and it stops at a depth and a node
count so a large object graph cannot make validation slow; tensors beyond those limits are simply not seen.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

MAX_DEPTH = 8
MAX_NODES = 20_000

_SKIPPED = (
    str,
    bytes,
    int,
    float,
    complex,
    bool,
    type(None),
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    torch.nn.Module,
    torch.dtype,
    torch.device,
    torch.Size,
)


_CONSTANTS = (str, bytes, int, float, complex, bool, type(None))


@dataclass
class Reachable:
    """What one walk finds, by path: `tensors`, `objects` (everything looked into that is not a tuple, list or
    mapping: a cache, its layers) and `constants` (numbers, strings, flags, None held by those)."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    objects: dict[str, Any] = field(default_factory=dict)
    constants: dict[str, Any] = field(default_factory=dict)


def tensor_slots(value: Any, root: str = "") -> dict[str, torch.Tensor]:
    """`{path: tensor}` for every tensor reachable from `value` (paths like `root[0]['k'].layers[1].keys`)."""
    return reachable(value, root).tensors


def reachable(value: Any, root: str = "") -> Reachable:
    """Every tensor, object and constant reachable from `value`. Objects and constants are where a stateful call's
    argument state is besides its tensors: an output which is one of the objects is matched with the object at
    the same place in another copy of the arguments, and the constants (a counter, a flag) are compared."""
    found = Reachable()
    visited: set[int] = set()
    stack: list[tuple[str, Any, int]] = [(root, value, 0)]
    while stack and len(visited) < MAX_NODES:
        path, item, depth = stack.pop()
        if isinstance(item, torch.Tensor):
            found.tensors.setdefault(path, item)
            continue
        if isinstance(item, _CONSTANTS):
            found.constants.setdefault(path, item)
            continue
        if isinstance(item, _SKIPPED) or depth >= MAX_DEPTH or id(item) in visited:
            continue
        visited.add(id(item))
        if not isinstance(item, (tuple, list, Mapping)):
            found.objects[path] = item
        children = _children(item)
        stack.extend((path + suffix, child, depth + 1) for suffix, child in reversed(children))
    return found


def _children(item: Any) -> list[tuple[str, Any]]:
    try:
        if isinstance(item, (tuple, list)):
            return [(f"[{index}]", child) for index, child in enumerate(item)]
        if isinstance(item, Mapping):
            return [(f"[{key!r}]", child) for key, child in list(item.items())]
        children = [(f".{name}", child) for name, child in vars(item).items()] if hasattr(item, "__dict__") else []
        for cls in type(item).__mro__:
            for name in getattr(cls, "__slots__", ()):
                if name not in ("__dict__", "__weakref__") and hasattr(item, name):
                    children.append((f".{name}", getattr(item, name)))
        return children
    except Exception:  # an object whose items or attributes cannot be read holds nothing we can check
        return []


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """A strided, unquantized view of the values (sparse tensors densified, quantized ones dequantized)."""
    tensor = tensor.detach()
    if tensor.layout != torch.strided:
        tensor = tensor.to_dense()
    if tensor.is_quantized:
        tensor = tensor.dequantize()
    return tensor


def count_changed(current: torch.Tensor, snapshot: torch.Tensor) -> int:
    """How many elements of `current` differ from `snapshot` (NaN equals NaN; a new shape or dtype: all of them)."""
    if current.shape != snapshot.shape or current.dtype != snapshot.dtype:
        return max(current.numel(), snapshot.numel(), 1)
    if current.numel() == 0:
        return 0
    current = _plain(current)
    snapshot = _plain(snapshot).to(current.device)
    differ = current != snapshot
    if current.is_floating_point() or current.is_complex():
        differ &= ~(torch.isnan(current) & torch.isnan(snapshot))
    return int(differ.sum())


def snapshot(tensor: torch.Tensor) -> torch.Tensor | None:
    """A private clone of `tensor`'s values that `count_changed` can compare it with; None when it cannot be
    compared (a tensor type without element-wise comparison): such a tensor is not watched."""
    try:
        copy = tensor.detach().clone()
        count_changed(tensor, copy)
    except Exception:
        return None
    return copy


def holds_tensors(value: Any) -> bool:
    """Whether `value` is an object (not a tensor) through which tensors are reachable: a cache a forward returns,
    compared by its state (`validator._check_state_object`)."""
    return not isinstance(value, torch.Tensor) and bool(reachable(value).tensors)


def holds_state_object(value: Any) -> bool:
    """Whether an object holding tensors (not a tuple, list or mapping of them) is reachable from `value`: an output
    with a cache in it, which a CUDA-graph backend cannot return (its tensors would be replay buffers)."""
    return any(holds_tensors(obj) for obj in reachable(value).objects.values())
