"""One tuned module in a checkpoint: its identity, weights, graph specs and one backend per graph.

A module entry of the manifest:

    {"name": ..., "path": <where the caller found it, or null>, "class": <class name>,
     "parameters": {state_dict key: {"shape": [...], "dtype": "torch.float32"}},
     "weights": <relative path of the torch.save'd state_dict>,
     "graph_specs": [GraphSpec.to_dict(), ...],
     "graphs": [{"graph": <graph name>, "backend": <backend entry, see backend_state.py>}, ...],
     ...caller extras}

The weights are saved because backends of the JIT type (Inductor, eager) re-create themselves from the
module; they are loaded with `torch.load(weights_only=True)`. `save_state` / `read_state` / `check_signature`
do the same for any module (the whole model's parts, see `aitune_aot.checkpoint_io`).

Loading is split so that a caller can stay all-or-nothing: `read_state` and `load_backends` read and build
without touching the model; only `apply_state` (and deploying the backends) changes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from aitune_core.checkpoint.backend_state import pack_backend, resolve_backend_class, unpack_backend_state
from aitune_core.errors import CheckpointError

if TYPE_CHECKING:
    from aitune_core.backends.backend import Backend
    from aitune_core.checkpoint.manifest import CheckpointReader, CheckpointWriter
    from aitune_core.specs.graph_spec import GraphSpec

__all__ = [
    "apply_state",
    "check_module",
    "check_signature",
    "load_backends",
    "load_weights",
    "module_signature",
    "read_state",
    "save_module",
    "save_state",
]


def _class_name(module: Any) -> str:
    return type(module).__qualname__


def module_signature(module: torch.nn.Module) -> dict[str, Any]:
    """Class name and the shape and dtype of every state_dict entry: what identifies "the same model"."""
    parameters = {
        key: {"shape": list(value.shape), "dtype": str(value.dtype)}
        for key, value in module.state_dict().items()
        if isinstance(value, torch.Tensor)
    }
    return {"class": _class_name(module), "parameters": parameters}


def save_module(
    writer: CheckpointWriter,
    *,
    name: str,
    module: torch.nn.Module,
    graphs: Sequence[tuple[GraphSpec, Backend]],
    folder: str,
    path: str | None = None,
    extra: dict[str, Any] | None = None,
    weights: str | None = None,
) -> dict[str, Any]:
    """Write weights and backend states of one tuned module under `folder`; returns its manifest entry.

    `weights`: a checkpoint file already holding exactly this module's state dict (written by `save_state`), used
    instead of writing the weights again."""
    signature = module_signature(module)
    weights = weights or save_state(writer, module, f"{folder}/weights.pt")
    graph_entries = []
    for index, (graph_spec, backend) in enumerate(graphs):
        graph_entries.append(
            {"graph": graph_spec.name, "backend": pack_backend(backend, writer, f"{folder}/graphs/{index}")}
        )
    return {
        "name": name,
        "path": path,
        **signature,
        "weights": weights,
        "graph_specs": [graph_spec.to_dict() for graph_spec, _ in graphs],
        "graphs": graph_entries,
        **(extra or {}),
    }


def save_state(writer: CheckpointWriter, module: torch.nn.Module, rel: str) -> str:
    """Write `module.state_dict()` (tensors on the CPU) to `rel`; returns `rel`."""
    state = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in module.state_dict().items()}
    return writer.write_torch(state, rel).path


_REQUIRED = {"name": str, "class": str, "parameters": dict, "weights": str, "graph_specs": list, "graphs": list}


def _valid_parameters(parameters: Any) -> bool:
    return isinstance(parameters, dict) and all(
        isinstance(info, dict) and isinstance(info.get("shape"), list) and isinstance(info.get("dtype"), str)
        for info in parameters.values()
    )


def check_module(entry: dict[str, Any], module: torch.nn.Module) -> None:
    """Raise CheckpointError when the entry is malformed or `module` is not the model it was saved from."""
    name = entry.get("name")
    malformed = [key for key, kind in _REQUIRED.items() if not isinstance(entry.get(key), kind)]
    if not _valid_parameters(entry.get("parameters")):
        malformed.append("parameters")
    if not all(isinstance(g, dict) for g in entry.get("graphs") or []):
        malformed.append("graphs")
    if entry.get("path") is not None and not isinstance(entry.get("path"), str):
        malformed.append("path")
    if malformed:
        raise CheckpointError(
            f"checkpoint manifest is corrupt: module {name!r} lacks valid {', '.join(dict.fromkeys(malformed))}"
        )
    check_signature(f"checkpoint module {name!r}", entry, module)


def check_signature(label: str, entry: dict[str, Any], module: torch.nn.Module) -> None:
    """Raise CheckpointError when `module` is not of the class and parameter shapes `entry` recorded."""
    if entry.get("class") != _class_name(module):
        raise CheckpointError(
            f"{label} was saved from a {entry.get('class')}, but the model has a {_class_name(module)} there"
        )
    if not _valid_parameters(entry.get("parameters")):
        raise CheckpointError(f"checkpoint manifest is corrupt: {label} has no valid parameter list")
    name = label
    saved = entry.get("parameters") or {}
    actual = module_signature(module)["parameters"]
    missing = sorted(set(saved) - set(actual))
    unexpected = sorted(set(actual) - set(saved))
    mismatched = [
        f"{key}: saved {saved[key]['shape']} {saved[key]['dtype']}, model {actual[key]['shape']} {actual[key]['dtype']}"
        for key in sorted(set(saved) & set(actual))
        if saved[key] != actual[key]
    ]
    details = [
        f"{label}: {'; '.join(items[:5])}{' ...' if len(items) > 5 else ''}"
        for label, items in (
            ("missing in the model", missing),
            ("not in the checkpoint", unexpected),
            ("different shape/dtype", mismatched),
        )
        if items
    ]
    if details:
        raise CheckpointError(f"{name} does not match the model ({' | '.join(details)})")


def read_state(reader: CheckpointReader, rel: Any, label: str) -> dict[str, Any]:
    """The state dict stored at `rel` (on the CPU; `weights_only=True`), without applying it."""
    if not isinstance(rel, str):
        raise CheckpointError(f"checkpoint manifest is corrupt: {label} has no valid weights file")
    state = reader.load_torch(rel, map_location="cpu")
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise CheckpointError(f"{label}: {rel} does not hold a state dict")
    return state


def apply_state(module: torch.nn.Module, state: dict[str, Any], label: str) -> None:
    """Copy `state` into `module` in place (keeping its devices and parameter objects)."""
    try:
        module.load_state_dict(state, strict=True)
    except Exception as exc:
        raise CheckpointError(f"{label}: cannot restore weights: {exc}") from exc


def load_weights(reader: CheckpointReader, entry: dict[str, Any], module: torch.nn.Module) -> None:
    """Copy the saved weights into `module` (in place, keeping the module's device)."""
    label = f"checkpoint module {entry.get('name')!r}"
    apply_state(module, read_state(reader, entry.get("weights"), label), label)


def load_backends(
    reader: CheckpointReader, entry: dict[str, Any], module: torch.nn.Module
) -> list[tuple[GraphSpec, Backend]]:
    """Graph specs and their backends in state CHECKPOINT_LOADED (the caller deploys or activates them)."""
    from aitune_core.specs.graph_spec import GraphSpec

    try:
        specs = {spec.name: spec for spec in (GraphSpec.from_dict(d) for d in entry["graph_specs"])}
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(
            f"checkpoint module {entry.get('name')!r}: malformed graph specs: {type(exc).__name__}: {exc}"
        ) from exc
    out = []
    for graph in entry.get("graphs", []):
        graph_name = graph.get("graph") if isinstance(graph, dict) else None
        if not isinstance(graph_name, str) or graph_name not in specs:
            raise CheckpointError(f"checkpoint module {entry.get('name')!r}: graph {graph_name!r} has no graph spec")
        backend_entry = graph.get("backend")
        if not isinstance(backend_entry, dict):
            raise CheckpointError(f"checkpoint module {entry.get('name')!r}, graph {graph_name!r}: no backend entry")
        try:
            backend_class = resolve_backend_class(backend_entry.get("type"))
            state = unpack_backend_state(backend_entry, reader)
        except CheckpointError as exc:
            raise CheckpointError(f"checkpoint module {entry.get('name')!r}, graph {graph_name!r}: {exc}") from exc
        try:
            backend = backend_class.from_dict(module, state)
        except Exception as exc:
            raise CheckpointError(
                f"checkpoint module {entry.get('name')!r}, graph {graph_name!r}: cannot restore "
                f"{backend_entry.get('type')}: {type(exc).__name__}: {exc}"
            ) from exc
        out.append((specs[graph_name], backend))
    return out
