"""Backend class lookup by class name, so that checkpoints can do `backend_class(name).from_dict(module, state)`.

Every concrete subclass of `Backend` is found by its class name without any registration step: the lookup walks
`Backend.__subclasses__()` recursively (so user-defined backends work as soon as their module is imported). The
built-in backend modules are imported on the first miss, which keeps `import aitune_core` cheap: those modules
import their optional libraries (tensorrt, torchao, onnxruntime, ...) lazily, inside `_build`.

`register_backend` is there for the rare case of two classes with the same name (e.g. a user backend that
shadows a built-in one): an explicitly registered class wins over the subclass walk.
"""

from __future__ import annotations

import importlib
import inspect
import logging

from aitune_core.backends.backend import Backend

_logger = logging.getLogger("aitune.backend.registry")

#: Modules that define the built-in backends; imported on demand (a module that is not there is skipped).
BUILTIN_BACKEND_MODULES: tuple[str, ...] = (
    "aitune_core.backends.torch_eager",
    "aitune_core.backends.torch_inductor",
    "aitune_core.backends.torchao",
    "aitune_core.backends.onnxruntime",
    "aitune_core.backends.tensorrt",
    "aitune_core.backends.torch_tensorrt",
)

_EXPLICIT: dict[str, type[Backend]] = {}
_builtins_imported = False


def register_backend(cls: type[Backend]) -> type[Backend]:
    """Class decorator: make `cls` the class found under its name (overrides the subclass walk)."""
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise TypeError(f"register_backend expects a Backend subclass, got {cls!r}")
    _EXPLICIT[cls.__name__] = cls
    return cls


def _import_builtins() -> None:
    global _builtins_imported
    if _builtins_imported:
        return
    _builtins_imported = True
    for module_name in BUILTIN_BACKEND_MODULES:
        try:
            importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:  # the module exists but one of its eager imports is missing
                _logger.debug("Backend module %s could not be imported: %s", module_name, exc)
        except Exception as exc:  # a broken optional backend must not break checkpoint loading of the others
            _logger.debug("Backend module %s could not be imported: %s", module_name, exc)


def _walk() -> dict[str, type[Backend]]:
    found: dict[str, type[Backend]] = {}
    stack = list(Backend.__subclasses__())
    while stack:
        cls = stack.pop(0)
        stack.extend(cls.__subclasses__())
        if inspect.isabstract(cls):
            continue
        found[cls.__name__] = cls  # later definitions of the same name win (e.g. re-imported test modules)
    found.update(_EXPLICIT)
    return found


def registered_backends() -> list[str]:
    """Names of every backend class that can be looked up now (built-ins included)."""
    _import_builtins()
    return sorted(_walk())


def backend_class(name: str) -> type[Backend]:
    """The concrete `Backend` subclass called `name`.

    Raises:
        KeyError: no such backend; the message lists the known names (the checkpoint layer turns it into a
            `CheckpointError`).
    """
    found = _walk()
    if name not in found:
        _import_builtins()
        found = _walk()
    if name not in found:
        known = ", ".join(sorted(found)) or "none"
        raise KeyError(
            f"Unknown backend type {name!r}; known backends: {known}. "
            "If it is a custom backend, import the module that defines it before loading."
        )
    return found[name]
