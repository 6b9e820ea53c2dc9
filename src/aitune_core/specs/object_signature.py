"""`object_signature(value)`: the layout of the state inside an object argument, as a short stable string.

Why: an object passed to a forward (a transformers `DynamicCache`, a diffusers attention-processor state, a
user's own cache) is neither a tensor nor a container aitune walks, so graph identity used to see only its type:
a prefill call (empty cache) and a decode call (cache holding tensors) of the same module fell into one graph,
with one backend validated on only one of them. The signature describes what is inside - which attributes hold
tensors of which rank and dtype, which are None, how many items a list holds, boolean flags - without sizes or
other numbers (a decode step that grows the cache by one token stays in its graph; its sizes are ranges, as for
any tensor). It is a digest of a bounded walk, deterministic across processes, so it can be stored with a graph.

The signature is checked on every dispatched call that passes such an object (each decoding step of a
`generate()` loop), so the walk takes the common leaves by exact type first, names dtypes and devices from a
table, and a layout already seen gets its digest from a table instead of `repr` and SHA-1 (a 12-layer
`DynamicCache`: about 105 us per call before, most of it that `repr` and the type tests). The digest is
unchanged, so signatures stored with decisions stay valid.
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


#: layouts already digested (bounded: cleared when full; a program has a handful)
_DIGESTS: dict[Any, str] = {}
_DIGESTS_MAX = 256
#: exact leaf types whose layout is their type name (sizes and counters change call to call)
_NAMED_LEAVES = {int: "int", float: "float", complex: "complex", str: "str", bytes: "bytes"}
_DTYPE_NAMES: dict[torch.dtype, str] = {}
_DEVICE_NAMES: dict[torch.device, str] = {}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)
    return name


def _device_name(device: torch.device) -> str:
    name = _DEVICE_NAMES.get(device)
    if name is None:
        name = _DEVICE_NAMES[device] = repr(device)
    return name


class _Walk:
    def __init__(self) -> None:
        self.budget = MAX_NODES
        self.seen: set[int] = set()

    def of(self, value: Any, depth: int) -> Any:
        self.budget -= 1
        if self.budget < 0:
            return "..."
        cls = type(value)
        if cls is torch.Tensor or isinstance(value, torch.Tensor):
            dtype = value.dtype
            return ("T", value.dim(), _DTYPE_NAMES.get(dtype) or _dtype_name(dtype))
        if value is None or cls is bool:
            return value
        named = _NAMED_LEAVES.get(cls)
        if named is not None:
            return named
        if cls is torch.device:
            return _device_name(value)
        return self._other(value, cls, depth)

    def _other(self, value: Any, cls: type, depth: int) -> Any:
        """Subclasses of the leaf types, enums, dtypes, and the containers and objects walked into."""
        kind, name = _kind(cls)
        if kind == _SCALAR:
            return cls.__name__  # (an int enum, a str subclass: named by its own class)
        if kind == _REPR:
            return repr(value)
        if kind == _OPAQUE or depth >= MAX_DEPTH or id(value) in self.seen:
            return name
        if kind == _CALLABLE:
            self.seen.add(id(value))
            return name
        self.seen.add(id(value))
        of, deeper = self.of, depth + 1
        if kind == _SEQUENCE:
            return (name, len(value), tuple([of(item, deeper) for item in value]))
        if kind == _MAPPING:
            try:
                return (name, tuple([(repr(k), of(v, deeper)) for k, v in value.items()]))
            except Exception:
                return name
        attributes = getattr(value, "__dict__", None)
        if not isinstance(attributes, dict):
            return name
        return (name, tuple([(k, of(v, deeper)) for k, v in sorted(attributes.items())]))


_SCALAR, _REPR, _OPAQUE, _SEQUENCE, _MAPPING, _CALLABLE, _OBJECT = range(7)
#: class -> (how the walk treats its instances, the name it gives them); classes are few, instances many
_KINDS: dict[type, tuple[int, str]] = {}


_KINDS_MAX = 4096


def _kind(cls: type) -> tuple[int, str]:
    known = _KINDS.get(cls)
    if known is None:
        if len(_KINDS) >= _KINDS_MAX:  # (classes made per call, e.g. a namedtuple per request)
            _KINDS.clear()
        known = _KINDS[cls] = (_classify(cls), f"{cls.__module__}.{cls.__qualname__}")
    return known


def _classify(cls: type) -> int:
    """The walk's treatment of `cls`'s instances, in the order the checks were always made."""
    if issubclass(cls, (int, float, complex, str, bytes)):
        return _SCALAR
    if issubclass(cls, (torch.dtype, torch.device, enum.Enum)):
        return _REPR
    if issubclass(cls, (torch.nn.Module, type)):
        return _OPAQUE
    if issubclass(cls, (list, tuple)):
        return _SEQUENCE
    if issubclass(cls, Mapping):
        return _MAPPING
    if any("__call__" in vars(base) for base in cls.__mro__):
        return _CALLABLE  # (`callable(value)`: a function, a bound method, a callable object: named, not walked)
    return _OBJECT


def _digest(layout: Any) -> str:
    try:
        known = _DIGESTS.get(layout)
    except TypeError:  # an unhashable layout (never built by `_Walk`, kept safe)
        known = None
    if known is not None:
        return known
    digest = hashlib.sha1(repr(layout).encode("utf-8", "backslashreplace")).hexdigest()[:12]
    try:
        if len(_DIGESTS) >= _DIGESTS_MAX:
            _DIGESTS.clear()
        _DIGESTS[layout] = digest
    except TypeError:
        pass
    return digest


def object_signature(value: Any) -> str:
    """A 12-hex-digit digest of the layout of `value`'s state (see the module docstring)."""
    try:
        layout = _Walk().of(value, 0)
    except Exception:  # an attribute that cannot be read: the type alone
        layout = type(value).__qualname__
    return _digest(layout)
