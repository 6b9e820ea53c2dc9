"""One tuned module in a checkpoint: its identity, weights, graph specs and one backend per graph.

A module entry of the manifest:

    {"name": ..., "path": <where the caller found it, or null>, "class": <class name>,
     "parameters": {state_dict key: {"shape": [...], "dtype": "torch.float32"}},
     "weights": <relative path of the torch.save'd state_dict>,
     "graph_specs": [GraphSpec.to_dict(), ...],
     "graphs": [{"graph": <graph name>, "backend": <backend entry, see backend_state.py>}, ...],
     ...caller extras}

The weights are saved because backends of the JIT type (Inductor, eager) re-create themselves from the
module; they are loaded with `torch.load(weights_only=True)`.
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

__all__ = ["check_module", "load_backends", "load_weights", "module_signature", "save_module"]


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
) -> dict[str, Any]:
    """Write weights and backend states of one tuned module under `folder`; returns its manifest entry."""
    signature = module_signature(module)
    weights = writer.write_torch(
        {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in module.state_dict().items()},
        f"{folder}/weights.pt",
    )
    graph_entries = []
    for index, (graph_spec, backend) in enumerate(graphs):
        graph_entries.append(
            {"graph": graph_spec.name, "backend": pack_backend(backend, writer, f"{folder}/graphs/{index}")}
        )
    return {
        "name": name,
        "path": path,
        **signature,
        "weights": weights.path,
        "graph_specs": [graph_spec.to_dict() for graph_spec, _ in graphs],
        "graphs": graph_entries,
        **(extra or {}),
    }


_REQUIRED = {"name": str, "class": str, "parameters": dict, "weights": str, "graph_specs": list, "graphs": list}


def check_module(entry: dict[str, Any], module: torch.nn.Module) -> None:
    """Raise CheckpointError when the entry is malformed or `module` is not the model it was saved from."""
    name = entry.get("name")
    malformed = [key for key, kind in _REQUIRED.items() if not isinstance(entry.get(key), kind)]
    if malformed:
        raise CheckpointError(f"checkpoint manifest is corrupt: module {name!r} lacks valid {', '.join(malformed)}")
    if entry.get("class") != _class_name(module):
        raise CheckpointError(
            f"checkpoint module {name!r} was saved from a {entry.get('class')}, "
            f"but the model has a {_class_name(module)} there"
        )
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
        raise CheckpointError(f"checkpoint module {name!r} does not match the model ({' | '.join(details)})")


def load_weights(reader: CheckpointReader, entry: dict[str, Any], module: torch.nn.Module) -> None:
    """Copy the saved weights into `module` (in place, keeping the module's device)."""
    state = reader.load_torch(entry["weights"], weights_only=True, map_location="cpu")
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(f"checkpoint module {entry.get('name')!r}: cannot restore weights: {exc}") from exc


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
        graph_name = graph.get("graph")
        if graph_name not in specs:
            raise CheckpointError(f"checkpoint module {entry.get('name')!r}: graph {graph_name!r} has no graph spec")
        backend_entry = graph.get("backend") or {}
        backend_class = resolve_backend_class(str(backend_entry.get("type")))
        state = unpack_backend_state(backend_entry, reader)
        try:
            backend = backend_class.from_dict(module, state)
        except Exception as exc:
            raise CheckpointError(
                f"checkpoint module {entry.get('name')!r}, graph {graph_name!r}: cannot restore "
                f"{backend_entry.get('type')}: {type(exc).__name__}: {exc}"
            ) from exc
        out.append((specs[graph_name], backend))
    return out
