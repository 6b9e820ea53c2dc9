"""`aitune.torch.save` / `load`: persist tuned modules to a checkpoint folder and restore them without tuning.

`model` is an aitune Module, a torch module containing aitune Modules (as submodules, or as raw modules
whose calls a wrapper routes), or any object holding such modules as attributes (a pipeline, e.g. diffusers).

The folder (format in `aitune_core.checkpoint`):

    manifest.json                         versions; "model": the model's parts (path, class, parameter shapes,
                                          weights file); "modules": per tuned module its name, path in the model
                                          ("" for the root), class, parameter shapes, graph specs, and per graph
                                          the backend type, key, config, state, state file and artifacts; every
                                          file with sha256
    model/<i>.pt                          the state_dict of each part of the model (the model itself when it is a
                                          torch module, else each torch module among its attributes)
    modules/<name>/weights.pt             the tuned module's state_dict (unless it is a whole part: then its
                                          entry points at that part's file)
    modules/<name>/graphs/<i>/state.pt    the backend's tensor state (tensors, dtypes), if any
    modules/<name>/graphs/<i>/artifacts/  files and folders the backend listed as pathlib.Path

`save()` stores the whole model's state, so loading into a freshly initialised instance computes what the saved
model did; a model whose parts differ in class or parameter shapes is refused.

`load()` never executes code from the checkpoint (JSON, `torch.load(weights_only=True)`, artifacts read only
by their backend's own loader; see the trust model in the README) and is all-or-nothing: it first reads the
manifest, matches and checks the model, verifies every checksum, reads every state and rebuilds every backend
without touching the model; then it changes the model inside a `LoadTransaction`, which restores it bit for bit
(no wrapper left) if anything fails. Every failure is a CheckpointError naming the entry and the reason.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from aitune_aot.load_transaction import LoadTransaction, original_forward
from aitune_aot.model_paths import find_modules, model_parts, resolve_path, unwrapped
from aitune_aot.module import Module, ModuleState, find_wrapper
from aitune_core.backends.backend import Backend
from aitune_core.checkpoint.manifest import CheckpointReader, CheckpointWriter
from aitune_core.checkpoint.module_state import (
    apply_state,
    check_module,
    check_signature,
    load_backends,
    module_signature,
    read_state,
    save_module,
    save_state,
)
from aitune_core.device_check import unavailable
from aitune_core.errors import CheckpointError
from aitune_core.log import install_stderr_warnings
from aitune_core.module_info import module_device
from aitune_core.specs.graph_spec import GraphSpec

__all__ = ["find_modules", "load", "save"]

_logger = logging.getLogger("aitune.aot.checkpoint")

CHECKPOINT_KIND = "aot"


# ------------------------------------------------------------------------------------------------ save
def save(model: Any, path: str | os.PathLike) -> None:
    """Save the whole model's state and every tuned aitune Module found in `model` to the checkpoint folder `path`
    (written atomically).

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

    for _module_path, wrapper in tuned:
        wrapper._refresh_backends()  # weights changed since tuning: refit first, never save stale backends
    with CheckpointWriter(path) as writer:
        parts = []
        part_files: dict[int, str] = {}
        for index, (part_path, part) in enumerate(model_parts(model)):
            rel = save_state(writer, part, f"model/{index}.pt")
            part_files[id(part)] = rel
            parts.append({"path": part_path, **module_signature(part), "weights": rel})
        entries = [
            save_module(
                writer,
                name=wrapper.name,
                module=wrapper.__wrapped__,
                graphs=wrapper.backends,
                folder=f"modules/{wrapper.name}",
                path=module_path,
                weights=part_files.get(id(wrapper.__wrapped__)),
            )
            for module_path, wrapper in tuned
        ]
        saved_to = writer.commit({"kind": CHECKPOINT_KIND, "model": {"parts": parts}, "modules": entries})
    _logger.info("Saved %d tuned module(s) and %d model part(s) to %s", len(entries), len(parts), saved_to)


# ------------------------------------------------------------------------------------------------ load plan
@dataclass
class _ModulePlan:
    """One checkpoint module: its entry, where it goes (an existing wrapper or a raw module), what to load."""

    entry: dict[str, Any]
    target: Module | torch.nn.Module
    weights: dict[str, Any] = field(default_factory=dict)
    graphs: list[tuple[GraphSpec, Backend]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.entry["name"]

    @property
    def module(self) -> torch.nn.Module:
        return unwrapped(self.target)


@dataclass
class _PartPlan:
    path: str
    module: torch.nn.Module
    state: dict[str, Any]


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
    names = [entry["name"] for entry in entries]
    if len(set(names)) != len(names):
        raise CheckpointError(f"checkpoint manifest in {reader.path} is corrupt: duplicate module names {names}")
    for entry in entries:
        if entry.get("path") is not None and not isinstance(entry.get("path"), str):
            raise CheckpointError(f"checkpoint manifest is corrupt: module {entry['name']!r} has an invalid path")
    return entries


def _part_entries(reader: CheckpointReader) -> list[dict[str, Any]]:
    model = reader.manifest.get("model")
    if model is None:  # format version 1: only the tuned modules' weights were saved
        return []
    parts = model.get("parts") if isinstance(model, dict) else None
    if not isinstance(parts, list) or not all(
        isinstance(p, dict) and isinstance(p.get("path"), str) and isinstance(p.get("weights"), str) for p in parts
    ):
        raise CheckpointError(f"checkpoint manifest in {reader.path} is corrupt: malformed model parts")
    return parts


def _raw_at(model: Any, entry: dict[str, Any]) -> torch.nn.Module | None:
    """The unwrapped torch module at the entry's path, when it is of the saved class (a model built without
    wrappers)."""
    path = entry.get("path")
    if path is None:
        return None
    raw = resolve_path(model, path)
    if not isinstance(raw, torch.nn.Module) or isinstance(raw, Module) or find_wrapper(raw) is not None:
        return None
    return raw if type(raw).__qualname__ == entry.get("class") else None


def _match(model: Any, entries: list[dict[str, Any]]) -> list[_ModulePlan]:
    """Pair each checkpoint entry with a wrapper of the model (same path first, then same name), or with the raw
    module at the saved path when the model was built without wrappers. Nothing is changed here."""
    found = find_modules(model)
    by_path = {path: wrapper for path, wrapper in found}
    by_name = {wrapper.name: wrapper for _, wrapper in found}
    plans: list[_ModulePlan] = []
    missing = []
    for entry in entries:
        path = entry.get("path")
        target: Module | torch.nn.Module | None = by_path.get(path) if path is not None else None
        if target is None:  # (explicit None checks: a wrapped container's truth value is its length)
            target = by_name.get(entry["name"])
        if target is None:
            target = _raw_at(model, entry)
        if target is None:
            missing.append(entry["name"])
        else:
            plans.append(_ModulePlan(entry, target))
    if missing:
        raise CheckpointError(
            f"checkpoint does not match the model: modules {missing} of the checkpoint were not found in the "
            f"model (model has aitune Modules {sorted(by_name) or 'none'}); wrap the same modules with the same "
            "names as when saving, or pass the model unwrapped with the same structure"
        )
    if len({id(plan.module) for plan in plans}) != len(plans):
        raise CheckpointError("checkpoint does not match the model: two checkpoint modules map to one model module")
    used = {id(plan.module) for plan in plans}
    for _, wrapper in found:
        if id(wrapper.__wrapped__) not in used:
            _logger.warning("load(): module `%s` is not in the checkpoint; left as it is", wrapper.name)
    return plans


def _match_parts(model: Any, parts: list[dict[str, Any]]) -> list[tuple[dict[str, Any], torch.nn.Module]]:
    out = []
    for part in parts:
        label = f"checkpoint model part {part['path'] or '<root>'!r}"
        module = resolve_path(model, part["path"])
        if not isinstance(module, torch.nn.Module):
            raise CheckpointError(f"{label} is not in the model (found {type(module).__name__} there)")
        module = unwrapped(module)
        check_signature(label, part, module)
        out.append((part, module))
    return out


def _check_device(device: torch.device | str | None) -> torch.device | None:
    if device is None:
        return None
    try:
        target = torch.device(device)
    except Exception as exc:
        raise CheckpointError(f"load(): {device!r} is not a device: {exc}") from exc
    reason = unavailable(target)
    if reason is not None:
        raise CheckpointError(f"load(): device {target} cannot be used: {reason}")
    return target


def _plan(model: Any, reader: CheckpointReader) -> tuple[list[_PartPlan], list[_ModulePlan]]:
    """Everything a load needs, read and built without changing the model."""
    entries = _module_entries(reader)
    plans = _match(model, entries)
    for plan in plans:
        check_module(plan.entry, plan.module)
        if not isinstance(plan.target, Module) and "forward" in plan.module.__dict__:
            raise CheckpointError(
                f"checkpoint module {plan.name!r}: the model's {type(plan.module).__name__} at "
                f"{plan.entry.get('path')!r} has an instance-level forward (patched by another tool, or JIT tuning "
                "is on); aitune cannot wrap it"
            )
    matched_parts = _match_parts(model, _part_entries(reader))
    reader.verify()  # every checksum, before any file is deserialized
    states: dict[str, dict[str, Any]] = {}  # a tuned root (or pipeline component) shares its part's file

    def state(rel: Any, label: str) -> dict[str, Any]:
        if not isinstance(rel, str) or rel not in states:
            value = read_state(reader, rel, label)
            states[rel] = value
        return states[rel]

    parts = []
    for part, module in matched_parts:
        label = f"checkpoint model part {part['path'] or '<root>'!r}"
        parts.append(_PartPlan(part["path"], module, state(part["weights"], label)))
    for plan in plans:
        plan.weights = state(plan.entry["weights"], f"checkpoint module {plan.name!r}")
        plan.graphs = load_backends(reader, plan.entry, plan.module)
        if not plan.graphs:
            raise CheckpointError(f"checkpoint module {plan.name!r} has no tuned graph")
    return parts, plans


# ------------------------------------------------------------------------------------------------ load
def _apply(
    model: Any, parts: list[_PartPlan], plans: list[_ModulePlan], device: torch.device | None, tx: LoadTransaction
) -> Any:
    """Change the model (inside `tx`): devices, weights, deployed backends, wrappers; returns the model to use."""
    if device is not None:
        for module in [part.module for part in parts] + [plan.module for plan in plans]:
            module.to(device)
    applied = set()
    for part in parts:
        apply_state(part.module, part.state, f"checkpoint model part {part.path or '<root>'!r}")
        applied.add((id(part.module), id(part.state)))
    for plan in plans:
        if (id(plan.module), id(plan.weights)) not in applied:  # not already restored as a whole part
            apply_state(plan.module, plan.weights, f"checkpoint module {plan.name!r}")
    for plan in plans:
        tx.deployed(backend for _, backend in plan.graphs)
        target_device = device if device is not None else (module_device(plan.module) or torch.device("cpu"))
        try:
            with original_forward(plan.target):
                for _spec, backend in plan.graphs:
                    backend.deploy(target_device)
        except Exception as exc:
            raise CheckpointError(
                f"checkpoint module {plan.name!r}: cannot deploy its backends on {target_device}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    result = model
    for plan in plans:
        wrapper = plan.target if isinstance(plan.target, Module) else _wrap(model, plan, tx)
        tx.swapped(wrapper, plan.graphs)
        if plan.entry.get("path") == "" and not isinstance(model, Module):
            result = wrapper  # the root was wrapped: the wrapper is the model to use
        _logger.info("Loaded module `%s` (%d graph(s))", wrapper.name, len(plan.graphs))
    return result


def _wrap(model: Any, plan: _ModulePlan, tx: LoadTransaction) -> Module:
    """Wrap a raw module of the model, named as saved. A torch parent gets the wrapper in place of the module;
    any other holder (a pipeline) keeps the raw module, whose calls the wrapper routes all the same."""
    wrapper = Module(plan.module, plan.name)
    tx.wrapped(wrapper)
    path = plan.entry["path"]
    if path:
        parent_path, _, attr = path.rpartition(".")
        parent = resolve_path(model, parent_path)
        if isinstance(parent, torch.nn.Module) and not isinstance(parent, Module):
            tx.set_attribute(parent, attr, wrapper)
    return wrapper


def load(model: Any, path: str | os.PathLike, device: torch.device | str | None = None) -> Any:
    """Restore the model state and the tuned modules saved in `path` into `model`, without tuning; returns the
    model to use: `model`, or the root wrapper when the checkpoint's root module was tuned and `model` is unwrapped.

        model = aitune.torch.load(Net(), "ckpt")   # a freshly built model: gets the saved weights and backends

    The model must have the same structure as when saving: modules wrapped with the same names (or at the same
    places), or unwrapped modules at the saved paths (they get wrapped). Backends are deployed on `device`
    (default: each module's device; when given, the model's parts are moved there).

    Raises:
        CheckpointError: missing or corrupt manifest or file, a path leaving the checkpoint folder, a checksum
            mismatch, a different model, an unknown backend, a device that is not available, a backend that
            cannot be restored. The model is then exactly as it was before the call.
    """
    install_stderr_warnings()  # (calls outside the restored ranges warn once, visibly: see aitune_core.log)
    target_device = _check_device(device)
    reader = CheckpointReader(path)
    try:
        parts, plans = _plan(model, reader)
    except CheckpointError:
        raise
    except Exception as exc:  # a malformed manifest that slipped past the checks: still the checkpoint's fault
        raise CheckpointError(f"checkpoint {reader.path} cannot be read: {type(exc).__name__}: {exc}") from exc
    tx = LoadTransaction([part.module for part in parts] + [plan.module for plan in plans])
    try:
        result = _apply(model, parts, plans, target_device, tx)
    except BaseException as exc:
        tx.rollback()
        if isinstance(exc, CheckpointError) or not isinstance(exc, Exception):
            raise
        raise CheckpointError(f"checkpoint {reader.path}: load failed: {type(exc).__name__}: {exc}") from exc
    tx.commit()
    _logger.info("Loaded %s (%d module(s), %d model part(s))", reader.path, len(plans), len(parts))
    return result
