"""Lazy import of a backend's optional library.

Backends import their heavy libraries only when they build, so that `import aitune.torch` needs the base
dependencies alone; a missing library becomes `BackendNotAvailableError`, which names the extra that installs
it and which strategies treat as a normal build failure.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from aitune_core.errors import BackendNotAvailableError


def import_optional(module_name: str, package: str, extra: str) -> ModuleType:
    """`module_name` imported; if missing, BackendNotAvailableError naming `package` and the `extra` to install."""
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendNotAvailableError(package, extra) from exc
