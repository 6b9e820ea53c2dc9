"""`aitune.torch.save` / `load`: persist tuned modules to a checkpoint folder and restore them without tuning.

`model` is an aitune Module, a torch module containing aitune Modules (as submodules, or as raw modules
whose calls a wrapper routes), or any object holding such modules as attributes (a pipeline).

The folder (format in `aitune_core.checkpoint`):

    manifest.json                         versions, per module: name, path in the model, class, parameter
                                          shapes, graph specs, and per graph the backend type, key, config,
                                          state, state file and artifacts, all files with sha256
    modules/<name>/weights.pt             the wrapped module's state_dict (JIT-type backends rebuild from it)
    modules/<name>/graphs/<i>/state.pt    the backend's non-JSON state (tensors, config objects), if any
    modules/<name>/graphs/<i>/artifacts/  files and folders the backend listed as pathlib.Path

Loading verifies every checksum before anything is deserialized, checks that the model matches (module
names, classes, parameter shapes), restores the weights (`weights_only=True`), then rebuilds each backend
with `Backend.from_dict` and deploys it. Backend state files are read with `torch.load(weights_only=False)`,
which can execute code stored in the file: load only checkpoints you trust. The checksums catch corruption
and edits of single files, not a forger who rewrites the manifest as well.
"""

from __future__ import annotations

import logging
import os
import types
from collections.abc import Iterator
from typing import Any

import torch

from aitune_aot.module import Module, ModuleState, find_wrapper
from aitune_core.checkpoint.manifest import CheckpointReader, CheckpointWriter
from aitune_core.checkpoint.module_state import check_module, load_backends, load_weights, save_module
from aitune_core.errors import CheckpointError

__all__ = ["find_modules", "load", "save"]

_logger = logging.getLogger("aitune.aot.checkpoint")

CHECKPOINT_KIND = "aot"
_MAX_ATTRIBUTE_DEPTH = 3
# attribute values that cannot hold a model's modules: not searched
_OPAQUE = (type, types.ModuleType, types.FunctionType, types.MethodType, types.BuiltinFunctionType, torch.Tensor)


def _walk_torch(prefix: str, module: torch.nn.Module) -> Iterator[tuple[str, Module]]:
    for sub_path, sub in module.named_modules(remove_duplicate=False):
        wrapper = find_wrapper(sub)
        if wrapper is not None:
            yield (f"{prefix}.{sub_path}" if prefix and sub_path else prefix or sub_path), wrapper


def _walk_object(prefix: str, obj: Any, depth: int, seen: set[int]) -> Iterator[tuple[str, Module]]:
    if id(obj) in seen or depth > _MAX_ATTRIBUTE_DEPTH or isinstance(obj, _OPAQUE):
        return
    seen.add(id(obj))
    if isinstance(obj, torch.nn.Module):
        yield from _walk_torch(prefix, obj)
        return
    if isinstance(obj, dict):
        items = [(str(k), v) for k, v in obj.items()]
    elif isinstance(obj, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(obj)]
    elif hasattr(obj, "__dict__"):
        items = list(vars(obj).items())
    else:
        return
    for key, value in items:
        yield from _walk_object(f"{prefix}.{key}" if prefix else key, value, depth + 1, seen)


def find_modules(model: Any) -> list[tuple[str, Module]]:
    """(path in `model`, wrapper) for every aitune Module reachable from `model`, each once."""
    found: dict[int, tuple[str, Module]] = {}
    for path, wrapper in _walk_object("", model, 0, set()):
        found.setdefault(id(wrapper), (path, wrapper))
    return list(found.values())


def save(model: Any, path: str | os.PathLike) -> None:
    """Save every tuned aitune Module found in `model` to the checkpoint folder `path` (written atomically).

    Modules that are not tuned are skipped with a warning; it is an error when none is tuned.
    """
    modules = find_modules(model)
    if not modules:
        raise CheckpointError(f"save(): no aitune Module found in {type(model).__name__}")
    tuned = []
    for module_path, wrapper in modules:
        if wrapper.state is ModuleState.TUNED:
            tuned.append((module_path, wrapper))
        else:
            _logger.warning("save(): module `%s` is %s, not tuned; it is not saved", wrapper.name, wrapper.state.value)
    if not tuned:
        raise CheckpointError("save(): none of the aitune Modules in the model is tuned; tune before saving")

    with CheckpointWriter(path) as writer:
        entries = [
            save_module(
                writer,
                name=wrapper.name,
                module=wrapper.__wrapped__,
                graphs=wrapper.backends,
                folder=f"modules/{wrapper.name}",
                path=module_path,
            )
            for module_path, wrapper in tuned
        ]
        saved_to = writer.commit({"kind": CHECKPOINT_KIND, "modules": entries})
    _logger.info("Saved %d tuned module(s) to %s", len(entries), saved_to)


def _module_entries(reader: CheckpointReader) -> list[dict[str, Any]]:
    manifest = reader.manifest
    if manifest.get("kind") != CHECKPOINT_KIND:
        raise CheckpointError(
            f"checkpoint {reader.path} is of kind {manifest.get('kind')!r}, not an ahead-of-time checkpoint"
        )
    entries = manifest.get("modules")
    if (
        not isinstance(entries, list)
        or not entries
        or not all(isinstance(e, dict) and isinstance(e.get("name"), str) for e in entries)
    ):
        raise CheckpointError(f"checkpoint manifest in {reader.path} is corrupt: no valid module list")
    return entries


def _match(model: Any, entries: list[dict[str, Any]]) -> list[tuple[dict[str, Any], Module | torch.nn.Module]]:
    """Pair each checkpoint entry with a wrapper of the model (same path first, then same name), or with the raw
    submodule at the saved path when the model was built without wrappers. Nothing is changed here: raw
    submodules are wrapped by `_install_wrappers` once every check has passed."""
    found = find_modules(model)
    by_path = {path: wrapper for path, wrapper in found}
    by_name = {wrapper.name: wrapper for _, wrapper in found}
    pairs: list[tuple[dict[str, Any], Module | torch.nn.Module]] = []
    missing = []
    for entry in entries:
        target: Module | torch.nn.Module | None = by_path.get(entry.get("path")) if entry.get("path") else None
        target = target or by_name.get(entry["name"])
        if target is None and isinstance(model, torch.nn.Module) and entry.get("path"):
            target = _raw_at_path(model, entry)
        if target is None:
            missing.append(entry["name"])
        else:
            pairs.append((entry, target))
    if missing:
        raise CheckpointError(
            f"checkpoint does not match the model: modules {missing} of the checkpoint were not found in the "
            f"model (model has aitune Modules {sorted(by_name) or 'none'}); wrap the same modules with the same "
            "names as when saving"
        )
    used = {id(target) for _, target in pairs}
    if len(used) != len(pairs):
        raise CheckpointError("checkpoint does not match the model: two checkpoint modules map to one model module")
    for _, wrapper in found:
        if id(wrapper) not in used:
            _logger.warning("load(): module `%s` is not in the checkpoint; left as it is", wrapper.name)
    return pairs


def _raw_at_path(model: torch.nn.Module, entry: dict[str, Any]) -> torch.nn.Module | None:
    """The unwrapped submodule at the entry's path, when it is of the saved class (a model built without wrappers)."""
    try:
        raw = model.get_submodule(entry["path"])
    except AttributeError:
        return None
    if isinstance(raw, Module) or find_wrapper(raw) is not None or type(raw).__qualname__ != entry.get("class"):
        return None
    return raw


def _install_wrappers(
    model: Any, pairs: list[tuple[dict[str, Any], Module | torch.nn.Module]]
) -> list[tuple[dict[str, Any], Module]]:
    """Wrap the raw submodules of `pairs` in place (named as saved); existing wrappers are kept."""
    installed = []
    for entry, target in pairs:
        if not isinstance(target, Module):
            wrapper = Module(target, entry["name"])
            parent_path, _, attr = entry["path"].rpartition(".")
            parent = model.get_submodule(parent_path) if parent_path else model
            setattr(parent, attr, wrapper)
            target = wrapper
        installed.append((entry, target))
    return installed


def _unwrapped(target: Module | torch.nn.Module) -> torch.nn.Module:
    return target.__wrapped__ if isinstance(target, Module) else target


def load(model: Any, path: str | os.PathLike, device: torch.device | str | None = None) -> Any:
    """Restore the tuned modules saved in `path` into `model`, without tuning; returns `model`.

    The model must have the same modules as when saving: either wrapped with the same names (or at the same
    places), or unwrapped torch submodules at the saved paths (they get wrapped). Backends are deployed on
    `device` (default: each module's device; when given, the module is moved there). The model is not changed
    unless the manifest matches it and every checksum verified.

    Raises:
        CheckpointError: missing or corrupt manifest, checksum mismatch, a different model, an unknown backend.
    """
    reader = CheckpointReader(path)
    entries = _module_entries(reader)
    names = [entry["name"] for entry in entries]
    if len(set(names)) != len(names):
        raise CheckpointError(f"checkpoint manifest in {reader.path} is corrupt: duplicate module names {names}")
    matched = _match(model, entries)
    for entry, target in matched:
        check_module(entry, _unwrapped(target))
    reader.verify()  # every checksum, before any file is deserialized
    target_device = torch.device(device) if device is not None else None
    for entry, wrapper in _install_wrappers(model, matched):
        load_weights(reader, entry, wrapper.__wrapped__)
        wrapper._load_backends(lambda module, entry=entry: load_backends(reader, entry, module), target_device)
        _logger.info("Loaded module `%s` from %s (%d graph(s))", wrapper.name, reader.path, len(wrapper.backends))
    return model
