"""Flatten nested call values into leaves with stable paths, and rebuild them.

Containers that are walked (everything else is a leaf):

- `tuple`, `list` (and their subclasses), namedtuples
- `dict` (and subclasses such as OrderedDict), any other `collections.abc.Mapping`
  (e.g. `transformers.BatchEncoding`, a UserDict)
- dataclass instances
- field-keyed mappings: `transformers.utils.ModelOutput`, diffusers' `BaseOutput`, and any other class
  that is a dataclass and a mapping at once (detected by duck typing: the core imports neither
  library). Only the keys the object reports (its non-None fields) are children, and the value is
  rebuilt with `cls(**fields)`: rebuilding such a class from `(key, value)` pairs, as a plain dict
  subclass would be, sets its first field to the list of pairs.

`torch.Size` is a leaf (a constant), not a tuple. A leaf is either a tensor (kind `tensor`) or a
constant (kind `const`: ints, floats, strings, None, any other object).

Paths ("locators") look like Python access expressions relative to the value:
`""` for a bare leaf, `[0]` for sequence items, `['x']` for mapping keys, `.logits` for dataclass,
namedtuple and ModelOutput fields; nested: `['inputs'][0].hidden`.

`flatten(value)` returns `(leaves, treedef)` where `leaves` is `[(locator, leaf), ...]` in a
deterministic order, and `unflatten(treedef, leaves)` rebuilds a value of the original container
types (it accepts the `(locator, leaf)` pairs or the bare leaf values). `TreeDef` is hashable and
compares by structure, so it can be part of a graph's identity; `to_dict` / `from_dict` carry it
through JSON (classes are stored by import path and looked up among the modules already imported, and only as
the container kind they were stored as; a class not found keeps its identity but is rebuilt as the nearest builtin
container).
"""

from __future__ import annotations

import collections
import dataclasses
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

TENSOR = "tensor"
CONST = "const"
TUPLE = "tuple"
LIST = "list"
NAMEDTUPLE = "namedtuple"
DICT = "dict"
MAPPING = "mapping"
DATACLASS = "dataclass"
MODEL_OUTPUT = "model_output"

LEAF_KINDS = (TENSOR, CONST)
_ATTR_KINDS = (NAMEDTUPLE, DATACLASS, MODEL_OUTPUT)
_KEY_KINDS = (DICT, MAPPING)

_SIMPLE_CONST_TYPES = (int, float, bool, str, bytes, complex, type(None))


def type_path(cls: type) -> str:
    """`module:qualname` of a class, the form `import_type` reads back."""
    return f"{cls.__module__}:{cls.__qualname__}"


def import_type(path: str | None, kind: str | None = None) -> type | None:
    """The class at a `type_path` among the modules already imported, or None (`<locals>` classes, moved modules,
    a module not imported yet: the value is rebuilt as the nearest builtin container).

    Paths come from files (a checkpoint's manifest, a JIT decision), which are not trusted: this never imports a
    module (an edited path ran `this`'s import side effect inside `aitune.torch.load`), and with `kind` it
    returns only a class that is such a container (an edited type of a list output built `subprocess.Popen` from
    the file's values at every tuned call; eighth review, 2026-11-26)."""
    if not path:
        return None
    module_name, _, qualname = path.partition(":")
    obj: Any = sys.modules.get(module_name)
    if obj is None:
        return None
    try:
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except Exception:
        return None
    if not isinstance(obj, type) or (kind is not None and not _fits(kind, obj)):
        return None
    return obj


def _fits(kind: str, cls: type) -> bool:
    """`cls` is a container of `kind` (what `_build` may construct from a file's values)."""
    checks: dict[str, Callable[[type], bool]] = {
        TUPLE: lambda c: issubclass(c, tuple),
        LIST: lambda c: issubclass(c, list),
        NAMEDTUPLE: lambda c: issubclass(c, tuple) and hasattr(c, "_fields"),
        DICT: lambda c: issubclass(c, dict),
        MAPPING: lambda c: issubclass(c, Mapping),
        MODEL_OUTPUT: _is_model_output_type,
        DATACLASS: dataclasses.is_dataclass,
    }
    check = checks.get(kind)
    return check is not None and bool(check(cls))


_KIND_CACHE: dict[type, str] = {}


def _is_model_output_type(cls: type) -> bool:
    """A mapping whose keys are its dataclass fields (ModelOutput, BaseOutput): rebuilt by keyword."""
    if any(base.__name__ == "ModelOutput" for base in cls.__mro__):
        return True
    return dataclasses.is_dataclass(cls) and issubclass(cls, Mapping)


def kind_of(value: Any) -> str:
    """The container kind of `value` (one of the module constants); leaves are `tensor` or `const`."""
    cls = type(value)
    kind = _KIND_CACHE.get(cls)
    if kind is not None:
        return kind
    if issubclass(cls, torch.Tensor):
        kind = TENSOR
    elif cls in _SIMPLE_CONST_TYPES or issubclass(cls, torch.Size):
        kind = CONST
    elif _is_model_output_type(cls):
        kind = MODEL_OUTPUT
    elif issubclass(cls, tuple):
        kind = NAMEDTUPLE if hasattr(cls, "_fields") else TUPLE
    elif issubclass(cls, list):
        kind = LIST
    elif issubclass(cls, dict):
        kind = DICT
    elif issubclass(cls, Mapping):
        kind = MAPPING
    elif dataclasses.is_dataclass(cls):
        kind = DATACLASS
    else:
        kind = CONST
    _KIND_CACHE[cls] = kind
    return kind


class TreeDef:
    """The container layout of a value: kinds, container classes, keys/fields, children.

    Equality and hash use `(kind, type name, keys, children)`; the live class object is only used to
    rebuild values.
    """

    __slots__ = ("_hash", "_key", "_paths", "children", "cls", "keys", "kind", "num_leaves", "type_name")

    def __init__(
        self,
        kind: str,
        children: tuple[TreeDef, ...] = (),
        keys: tuple[Any, ...] = (),
        cls: type | None = None,
        type_name: str | None = None,
    ) -> None:
        self.kind = kind
        self.children = children
        self.keys = keys
        self.cls = cls
        self.type_name = type_name
        if kind in LEAF_KINDS:
            self.num_leaves = 1
        else:
            self.num_leaves = sum(child.num_leaves for child in children)
        self._key: tuple[Any, ...] = (kind, type_name, keys, tuple(child._key for child in children))
        self._hash = hash(self._key)
        self._paths: list[tuple[str, tuple[str, ...]]] | None = None

    # -- identity -------------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, TreeDef):
            return NotImplemented
        return self._hash == other._hash and self._key == other._key

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        if self.kind in LEAF_KINDS:
            return "*" if self.kind == TENSOR else "c"
        name = self.type_name.rsplit(":", 1)[-1] if self.type_name else self.kind
        if self.kind in _KEY_KINDS or self.kind in _ATTR_KINDS:
            inner = ", ".join(f"{k!s}={c!r}" for k, c in zip(self.keys, self.children))
        else:
            inner = ", ".join(repr(c) for c in self.children)
        return f"{name}({inner})"

    # -- leaves ---------------------------------------------------------------------------------
    def leaf_kinds(self) -> list[str]:
        """`tensor` / `const` for each leaf, in flatten order."""
        out: list[str] = []
        _collect_leaf_kinds(self, out)
        return out

    def leaf_paths(self) -> list[tuple[str, tuple[str, ...]]]:
        """`(locator, name parts)` for each leaf, in flatten order (computed once per TreeDef)."""
        if self._paths is None:
            out: list[tuple[str, tuple[str, ...]]] = []
            _collect_paths(self, "", (), out)
            self._paths = out
        return self._paths

    # -- serialization --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        if self.kind in LEAF_KINDS:
            return {"kind": self.kind}
        out: dict[str, Any] = {"kind": self.kind, "children": [c.to_dict() for c in self.children]}
        if self.type_name is not None:
            out["type"] = self.type_name
        if self.keys:
            out["keys"] = [_encode_key(k) for k in self.keys]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TreeDef:
        kind = data["kind"]
        if kind in LEAF_KINDS:
            return _LEAF_DEFS[kind]
        type_name = data.get("type")
        return cls(
            kind,
            tuple(cls.from_dict(c) for c in data.get("children", ())),
            tuple(_decode_key(k) for k in data.get("keys", ())),
            import_type(type_name, kind),
            type_name,
        )


_TENSOR_DEF = TreeDef(TENSOR)
_CONST_DEF = TreeDef(CONST)
_LEAF_DEFS = {TENSOR: _TENSOR_DEF, CONST: _CONST_DEF}


def _encode_key(key: Any) -> Any:
    if isinstance(key, str):
        return key
    if isinstance(key, bool) or key is None or isinstance(key, float):
        return {"v": key}
    if isinstance(key, int):
        return {"int": key}
    return {"repr": repr(key)}


def _decode_key(data: Any) -> Any:
    if isinstance(data, str):
        return data
    if "int" in data:
        return int(data["int"])
    if "v" in data:
        return data["v"]
    return data["repr"]


def _collect_leaf_kinds(td: TreeDef, out: list[str]) -> None:
    if td.kind in LEAF_KINDS:
        out.append(td.kind)
        return
    for child in td.children:
        _collect_leaf_kinds(child, out)


def _collect_paths(td: TreeDef, locator: str, parts: tuple[str, ...], out: list) -> None:
    if td.kind in LEAF_KINDS:
        out.append((locator, parts))
        return
    if td.kind in _ATTR_KINDS:
        for key, child in zip(td.keys, td.children):
            _collect_paths(child, f"{locator}.{key}", (*parts, str(key)), out)
    elif td.kind in _KEY_KINDS:
        for key, child in zip(td.keys, td.children):
            _collect_paths(child, f"{locator}[{key!r}]", (*parts, str(key)), out)
    else:
        for index, child in enumerate(td.children):
            _collect_paths(child, f"{locator}[{index}]", (*parts, str(index)), out)


# ---------------------------------------------------------------------------------------------
# flatten
# ---------------------------------------------------------------------------------------------
def _flatten_into(value: Any, out: list[Any]) -> TreeDef:
    kind = kind_of(value)
    if kind is TENSOR:
        out.append(value)
        return _TENSOR_DEF
    if kind is CONST:
        out.append(value)
        return _CONST_DEF
    cls = type(value)
    if kind is TUPLE or kind is LIST:
        children = tuple(_flatten_into(item, out) for item in value)
        exact = cls is tuple or cls is list
        return TreeDef(kind, children, (), None if exact else cls, None if exact else type_path(cls))
    if kind is NAMEDTUPLE:
        children = tuple(_flatten_into(item, out) for item in value)
        return TreeDef(kind, children, tuple(cls._fields), cls, type_path(cls))
    if kind is DICT or kind is MAPPING or kind is MODEL_OUTPUT:
        keys = tuple(value.keys())
        children = tuple(_flatten_into(value[k], out) for k in keys)
        exact = cls is dict
        return TreeDef(kind, children, keys, None if exact else cls, None if exact else type_path(cls))
    # dataclass
    names = tuple(f.name for f in dataclasses.fields(value))
    children = tuple(_flatten_into(getattr(value, n), out) for n in names)
    return TreeDef(kind, children, names, cls, type_path(cls))


def flatten_values(value: Any) -> tuple[list[Any], TreeDef]:
    """Like `flatten` without the locators: `(leaf values, treedef)`. Cheaper; used on dispatch paths."""
    out: list[Any] = []
    treedef = _flatten_into(value, out)
    return out, treedef


def flatten(value: Any) -> tuple[list[tuple[str, Any]], TreeDef]:
    """`([(locator, leaf), ...], treedef)` for a nested value; the order is deterministic."""
    values, treedef = flatten_values(value)
    return [(path[0], leaf) for path, leaf in zip(treedef.leaf_paths(), values)], treedef


def tensor_leaves(value: Any) -> list[tuple[str, torch.Tensor]]:
    """`[(locator, tensor), ...]` for every tensor in a nested value."""
    leaves, _ = flatten(value)
    return [(locator, leaf) for locator, leaf in leaves if isinstance(leaf, torch.Tensor)]


# ---------------------------------------------------------------------------------------------
# unflatten
# ---------------------------------------------------------------------------------------------
def _as_leaf_values(leaves: Sequence[Any]) -> list[Any]:
    # Pairs produced by `flatten` are plain 2-tuples whose first item is a str. A real leaf is never a
    # plain tuple (tuples are containers), so the two forms cannot be confused.
    if leaves and all(type(item) is tuple and len(item) == 2 and isinstance(item[0], str) for item in leaves):
        return [item[1] for item in leaves]
    return list(leaves)


def _build(td: TreeDef, it: Iterator[Any]) -> Any:
    kind = td.kind
    if kind in LEAF_KINDS:
        return next(it)
    children = [_build(child, it) for child in td.children]
    cls = td.cls
    if kind in (TUPLE, LIST):
        base = tuple if kind == TUPLE else list
        if cls is None:
            return base(children)
        try:
            return cls(children)
        except Exception:
            return base(children)
    if kind == NAMEDTUPLE:
        if cls is None:
            return tuple(children)
        return cls(*children)
    pairs = list(zip(td.keys, children))
    if kind == DICT:
        if cls is None:
            return dict(pairs)
        if issubclass(cls, collections.defaultdict):
            return cls(None, pairs)
        try:
            return cls(pairs)
        except Exception:
            return dict(pairs)
    if kind == MAPPING:
        if cls is None:
            return dict(pairs)
        try:
            return cls(dict(pairs))
        except Exception:
            return dict(pairs)
    if kind == MODEL_OUTPUT:
        if cls is None:
            return dict(pairs)
        try:
            return cls(**dict(pairs))
        except TypeError:  # a key that is not a constructor argument: set the items one by one
            obj = cls()
            for key, child in pairs:
                obj[key] = child
            return obj
    # dataclass: restore the fields as they were, without running __init__ / __post_init__ again
    if cls is None:
        return dict(pairs)
    obj = cls.__new__(cls)
    for name, child in pairs:
        object.__setattr__(obj, name, child)
    return obj


def unflatten(treedef: TreeDef, leaves: Sequence[Any]) -> Any:
    """Rebuild a value of `treedef`'s layout from its leaves (values or `(locator, value)` pairs)."""
    values = _as_leaf_values(leaves)
    if len(values) != treedef.num_leaves:
        raise ValueError(f"unflatten: treedef has {treedef.num_leaves} leaves, got {len(values)}")
    return _build(treedef, iter(values))


def tree_map(fn: Callable[[torch.Tensor], Any], value: Any) -> Any:
    """Apply `fn` to every tensor of a nested value; constants are kept; containers are rebuilt."""
    values, treedef = flatten_values(value)
    if not any(isinstance(v, torch.Tensor) for v in values):
        return value if treedef.kind in LEAF_KINDS else _build(treedef, iter(values))
    return _build(treedef, iter(fn(v) if isinstance(v, torch.Tensor) else v for v in values))
