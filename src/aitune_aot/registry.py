"""Registry of the live `aitune.torch.Module` wrappers, keyed by a sanitized, unique name.

`tune()` drives every registered wrapper, and checkpoints identify wrappers by name, so names must be
usable as folder names (cache and checkpoint layout) and must not collide. The registry holds weak
references: a wrapper that the program dropped is not tuned by a later `tune()`. A wrapper and its module's
routed forward refer to each other, so a dropped wrapper lives until the garbage collector runs; a name
collision therefore runs a collection first, so that re-creating a wrapper (a notebook cell run twice, a test
after another) gets its name back instead of a `_1` suffix that its checkpoint would then carry.

The registry is generic in what it holds and never imports `aitune_aot.module`: the wrapper registers itself
here, so the dependency points one way (module -> registry).
"""

from __future__ import annotations

import gc
import logging
import re
import threading
import weakref
from typing import Any, Generic, TypeVar

_logger = logging.getLogger("aitune.aot.registry")

_INVALID_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")

#: what the registry holds: `aitune_aot.module.Module` wrappers in `MODULE_REGISTRY`
W = TypeVar("W")


def sanitize_name(name: str | None) -> str | None:
    """Name safe to use as a folder name: runs of other characters become `_`; None or empty stays None."""
    if name is None:
        return None
    cleaned = _INVALID_CHARS.sub("_", str(name).strip()).strip(".").rstrip("_")
    return cleaned or None


def default_name(obj: Any) -> str:
    """Default wrapper name: the wrapped object's class name."""
    return sanitize_name(type(obj).__name__) or "module"


class ModuleRegistry(Generic[W]):
    """Name -> live wrapper, in registration order."""

    def __init__(self) -> None:
        self._modules: weakref.WeakValueDictionary[str, W] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()

    def register(self, name: str, module: W, *, explicit: bool) -> str:
        """Register `module` under `name` or, when taken, under the first free `name_<n>`; returns the name used."""
        holder = self._modules.get(name)
        if holder is not None and holder is not module:
            del holder
            gc.collect()  # the holder may be a dropped wrapper kept only by its reference cycle
        with self._lock:
            unique = name
            suffix = 0
            while unique in self._modules and self._modules.get(unique) is not module:
                suffix += 1
                unique = f"{name}_{suffix}"
            if unique != name and explicit:
                _logger.warning("Module name %r is already in use; registering this module as %r", name, unique)
            self._modules[unique] = module
            return unique

    def get(self, name: str) -> W | None:
        return self._modules.get(name)

    def modules(self) -> list[W]:
        """Live wrappers in registration order."""
        with self._lock:
            return list(self._modules.values())

    def names(self) -> list[str]:
        with self._lock:
            return list(self._modules.keys())

    def clear(self) -> None:
        with self._lock:
            self._modules.clear()

    def __len__(self) -> int:
        return len(self._modules)

    def __contains__(self, name: object) -> bool:
        return name in self._modules


#: the live `aitune.torch.Module` wrappers (each registers itself when created)
MODULE_REGISTRY: ModuleRegistry[Any] = ModuleRegistry()
