"""`SampleMetadata`: the structure of one side (inputs or outputs) of a call.

It holds the container layout (`structure`, a `TreeDef`), a `TensorSpec` per tensor leaf (in flatten
order) and the non-tensor leaves (`constants`, as `(locator, value)`).

Graph identity (`identity(strict)`) is the layout, each tensor's rank and dtype, and, in strict mode,
the constants. Constants compare by value for simple types (None, bool, int, float, str, bytes,
complex, torch.Size, torch.dtype, torch.device, enum members) and by type only for any other object,
so an arbitrary object argument (a config, a cache object) does not make every call a new graph.
Shapes within a rank are not part of identity: they are ranges (see `axis_inference`).
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from aitune_core.specs.object_signature import object_signature
from aitune_core.specs.tensor_spec import TensorSpec, dtype_from_str
from aitune_core.specs.tree import TENSOR, TreeDef, flatten_values, import_type, type_path, unflatten

DEFAULT_NAME = "value"


class OpaqueConstant:
    """A constant read back from JSON that cannot be rebuilt as a value; it keeps its identity key."""

    __slots__ = ("key",)

    def __init__(self, key: tuple[Any, ...]) -> None:
        self.key = key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OpaqueConstant) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"<{self.key[-1]}>" if self.key else "<opaque>"


def constant_key(value: Any) -> Hashable:
    """The part of a non-tensor leaf that takes part in strict-mode graph identity."""
    cls = type(value)
    if value is None:
        return None
    if cls is bool or cls is int or cls is str:
        return (cls.__name__, value)
    if cls is float or cls is complex:
        return (cls.__name__, repr(value))  # repr: nan == nan for identity purposes
    if cls is bytes:
        return ("bytes", value.hex())
    if isinstance(value, torch.Size):
        return ("size", tuple(value))
    if isinstance(value, torch.dtype):
        return ("dtype", str(value))
    if isinstance(value, torch.device):
        return ("device", str(value))
    if isinstance(value, enum.Enum):
        return ("enum", type_path(cls), value.name)
    if isinstance(value, OpaqueConstant):
        return value.key
    if isinstance(value, type):
        return ("class", type_path(value))
    return ("type", type_path(cls), object_signature(value))


def _frozen(value: Any) -> Any:
    """What a spec keeps of a constant: the value itself when it is immutable, else its identity key - a spec
    must not hold on to (or change with) a caller's live object such as a KV cache."""
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes, torch.Size, torch.dtype,
                                           torch.device, enum.Enum, OpaqueConstant, type)):
        return value
    return OpaqueConstant(constant_key(value))


def encode_constant(value: Any) -> Any:
    """JSON form of a constant (plain JSON where possible; `{"key": [...]}` otherwise)."""
    if value is None or type(value) in (bool, int, str):
        return value
    if type(value) is float and value == value and value not in (float("inf"), float("-inf")):
        return value
    key = constant_key(value)
    return {"key": [list(k) if isinstance(k, tuple) else k for k in key]}


def decode_constant(data: Any) -> Any:
    if not isinstance(data, dict):
        return data
    key = tuple(tuple(k) if isinstance(k, list) else k for k in data["key"])
    tag = key[0]
    if tag in ("float", "complex"):
        return (float if tag == "float" else complex)(key[1])
    if tag == "bytes":
        return bytes.fromhex(key[1])
    if tag == "size":
        return torch.Size(key[1])
    if tag == "dtype":
        return dtype_from_str(key[1])
    if tag == "device":
        return torch.device(key[1])
    if tag == "enum":
        enum_cls = import_type(key[1])
        if enum_cls is not None and issubclass(enum_cls, enum.Enum) and key[2] in enum_cls.__members__:
            return enum_cls[key[2]]
        return OpaqueConstant(key)
    return OpaqueConstant(key)


def leaf_names(treedef: TreeDef, prefix: str = "") -> list[str]:
    """A unique name per leaf: the prefix and the path parts joined by `_` (`outputs_logits`, `x_0`)."""
    names: list[str] = []
    used: set[str] = set()
    for _locator, parts in treedef.leaf_paths():
        name = "_".join(p for p in (prefix, *parts) if p) or DEFAULT_NAME
        unique, n = name, 1
        while unique in used:
            unique, n = f"{name}_{n}", n + 1
        used.add(unique)
        names.append(unique)
    return names


def call_identity(values: Sequence[Any], treedef: TreeDef, strict: bool) -> tuple[Any, ...]:
    """Identity of one flattened observation; equals `SampleMetadata.from_leaves(...).identity(strict)`."""
    tensors = []
    consts = [] if strict else None
    for v in values:
        if isinstance(v, torch.Tensor):
            tensors.append((v.dim(), v.dtype))
        elif consts is not None:
            consts.append(constant_key(v))
    return (treedef, tuple(tensors), None if consts is None else tuple(consts))


@dataclass(frozen=True, eq=False)
class SampleMetadata:
    """Structure of a call's inputs or outputs: layout, tensor specs and constant leaves."""

    tensors: tuple[TensorSpec, ...]
    structure: TreeDef
    constants: tuple[tuple[str, Any], ...] = ()

    # -- construction ---------------------------------------------------------------------------
    @classmethod
    def from_value(cls, value: Any, *, names_prefix: str = "") -> SampleMetadata:
        """Metadata of one observation (every axis static)."""
        values, treedef = flatten_values(value)
        return cls.from_leaves(values, treedef, names_prefix=names_prefix)

    @classmethod
    def from_leaves(cls, values: Sequence[Any], treedef: TreeDef, *, names_prefix: str = "") -> SampleMetadata:
        paths = treedef.leaf_paths()
        names = leaf_names(treedef, names_prefix)
        tensors: list[TensorSpec] = []
        constants: list[tuple[str, Any]] = []
        for (locator, _parts), name, value in zip(paths, names, values):
            if isinstance(value, torch.Tensor):
                tensors.append(TensorSpec.from_tensor(value, locator=locator, name=name))
            else:
                constants.append((locator, _frozen(value)))
        return cls(tuple(tensors), treedef, tuple(constants))

    def with_tensors(self, tensors: Sequence[TensorSpec]) -> SampleMetadata:
        """The same structure with updated tensor specs (same count and order)."""
        if len(tensors) != len(self.tensors):
            raise ValueError(f"expected {len(self.tensors)} tensor specs, got {len(tensors)}")
        return replace(self, tensors=tuple(tensors))

    # -- identity -------------------------------------------------------------------------------
    def constant_keys(self) -> tuple[Hashable, ...]:
        return tuple(constant_key(v) for _, v in self.constants)

    def identity(self, strict: bool) -> tuple[Any, ...]:
        """Layout + rank and dtype of each tensor (+ the constants when `strict`)."""
        tensors = tuple((t.ndim, t.dtype) for t in self.tensors)
        return (self.structure, tensors, self.constant_keys() if strict else None)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SampleMetadata):
            return NotImplemented
        return (
            self.structure == other.structure
            and self.tensors == other.tensors
            and [loc for loc, _ in self.constants] == [loc for loc, _ in other.constants]
            and self.constant_keys() == other.constant_keys()
        )

    def __hash__(self) -> int:
        return hash((self.structure, self.tensors, self.constant_keys()))

    # -- queries --------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    def tensor(self, name: str) -> TensorSpec:
        for spec in self.tensors:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def non_static_axes(self) -> dict[str, list[int]]:
        """`{tensor name: [axis, ...]}` for every tensor with a batch or dynamic axis."""
        return {t.name: t.non_static_axes() for t in self.tensors if t.non_static_axes()}

    def has_batch_axis(self) -> bool:
        return any(t.batch_axes() for t in self.tensors)

    def unflatten(self, tensors: Sequence[torch.Tensor]) -> Any:
        """Rebuild a value of this layout from its tensors (in `self.tensors` order) and the recorded constants.

        Backends that run flat tensor graphs (ONNX Runtime, TensorRT) use it to give the caller back the
        structure the original module returned.
        """
        if len(tensors) != len(self.tensors):
            raise ValueError(f"expected {len(self.tensors)} tensors, got {len(tensors)}")
        tensor_iter = iter(tensors)
        const_iter = iter(v for _, v in self.constants)
        leaves = [next(tensor_iter) if kind == TENSOR else next(const_iter) for kind in self.structure.leaf_kinds()]
        return unflatten(self.structure, leaves)

    # -- serialization / display ----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "tensors": [t.to_dict() for t in self.tensors],
            "structure": self.structure.to_dict(),
            "constants": [[locator, encode_constant(value)] for locator, value in self.constants],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SampleMetadata:
        return cls(
            tensors=tuple(TensorSpec.from_dict(t) for t in data["tensors"]),
            structure=TreeDef.from_dict(data["structure"]),
            constants=tuple((locator, decode_constant(value)) for locator, value in data.get("constants", ())),
        )
