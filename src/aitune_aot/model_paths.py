"""Where the parts of a model are: the aitune Modules in it, the torch modules that hold its state, and the
dotted paths that name them in a checkpoint.

`model` is a torch module, an aitune Module, or any object holding modules as attributes, dict values or list
items (a pipeline, e.g. a diffusers `DiffusionPipeline`). A path is the dotted sequence of attribute names, dict
keys and list indices from `model`; torch submodules are named as in `named_modules()`; the root is "".
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from typing import Any

import torch

from aitune_aot.module import Module, find_wrapper

__all__ = ["find_modules", "model_parts", "resolve_path", "unwrapped"]

MAX_ATTRIBUTE_DEPTH = 3
# attribute values that cannot hold a model's modules: not searched
_OPAQUE = (type, types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType, torch.Tensor)


def unwrapped(target: Any) -> Any:
    """The torch module behind an aitune Module (anything else as it is)."""
    return target.__wrapped__ if isinstance(target, Module) else target


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix and key else prefix or key


def _children(obj: Any) -> list[tuple[str, Any]]:
    """The named values an object (not a torch module) holds: dict items, list items, or its attributes."""
    if isinstance(obj, dict):
        return [(str(k), v) for k, v in obj.items()]
    if isinstance(obj, (list, tuple)):
        return [(str(i), v) for i, v in enumerate(obj)]
    if hasattr(obj, "__dict__"):
        return list(vars(obj).items())
    return []


def _walk(prefix: str, obj: Any, depth: int, seen: set[int]) -> Iterator[tuple[str, torch.nn.Module]]:
    """(path, torch module) for the outermost torch modules reachable from `obj` (not descending into them)."""
    if id(obj) in seen or depth > MAX_ATTRIBUTE_DEPTH or isinstance(obj, _OPAQUE):
        return
    seen.add(id(obj))
    if isinstance(obj, torch.nn.Module):
        yield prefix, obj
        return
    for key, value in _children(obj):
        yield from _walk(_join(prefix, key), value, depth + 1, seen)


def find_modules(model: Any) -> list[tuple[str, Module]]:
    """(path in `model`, wrapper) for every aitune Module reachable from `model`, each once."""
    found: dict[int, tuple[str, Module]] = {}
    for prefix, top in _walk("", model, 0, set()):
        for sub_path, sub in top.named_modules(remove_duplicate=False):
            wrapper = find_wrapper(sub)
            if wrapper is not None:
                found.setdefault(id(wrapper), (_join(prefix, sub_path), wrapper))
    return list(found.values())


def model_parts(model: Any) -> list[tuple[str, torch.nn.Module]]:
    """The torch modules that hold the model's whole state: the model itself when it is a torch module, else the
    outermost torch modules among its attributes (a pipeline's components), each once, unwrapped."""
    parts: dict[int, tuple[str, torch.nn.Module]] = {}
    for path, module in _walk("", model, 0, set()):
        module = unwrapped(module)
        parts.setdefault(id(module), (path, module))
    return list(parts.values())


def _step(current: Any, key: str) -> Any:
    if isinstance(current, torch.nn.Module):
        current = unwrapped(current)
        if key in current._modules:
            return current._modules[key]
        return getattr(current, key)
    if isinstance(current, dict):
        matches = [v for k, v in current.items() if str(k) == key]
        if len(matches) != 1:
            raise KeyError(key)
        return matches[0]
    if isinstance(current, (list, tuple)):
        return current[int(key)]
    return vars(current)[key]


def resolve_path(model: Any, path: str) -> Any | None:
    """The object at `path` in `model` (as found by `find_modules` / `model_parts`), or None."""
    current = model
    if path == "":
        return current
    try:
        for key in path.split("."):
            current = _step(current, key)
    except (AttributeError, KeyError, IndexError, ValueError, TypeError):
        return None
    return current
