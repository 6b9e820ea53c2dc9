"""Keys of tuning decisions: stable across processes, equal for identical modules.

A tuning decision (which backend a graph of a module runs on, or why it stays eager) depends on what the module
computes and on where it runs, never on the module's weights or its place in a model. So the key is made of:

- the module's structure: class (module + qualname), and the name, shape and dtype of every parameter and
  buffer (not their values): the 16 identical blocks of a transformer share one key;
- the graph: the graph spec's JSON (`GraphSpec.to_dict`) without its name (names count graphs per module);
- how it is tuned: the strategy's class, its thresholds (`min_speedup`, ...) and the keys of its candidate
  backends (`Backend.key()`);
- the environment: torch, CUDA and aitune versions, the GPU's name, the Python version.

Every part is canonical JSON, hashed with sha256: the same module in another process gets the same key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from aitune_core.backends.backend import Backend
    from aitune_core.specs.graph_spec import GraphSpec

#: strategy attributes that are part of the key when the strategy has them
_STRATEGY_KNOBS = ("min_speedup", "min_eager_latency_us", "skip_single_layer", "profile_at_recorded_shapes")
#: bump when the layout of a key or of a stored decision changes: older entries stop matching
KEY_VERSION = 1


def _digest(payload: Any) -> str:
    text = json.dumps(payload, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _tensor_entry(name: str, tensor: torch.Tensor) -> list[Any]:
    try:
        shape: Any = list(tensor.shape)
    except (RuntimeError, ValueError):  # a lazy (uninitialized) parameter has no shape yet
        shape = "uninitialized"
    return [name, shape, str(tensor.dtype), tensor.device.type]


def module_structure(module: torch.nn.Module) -> dict[str, Any]:
    """What identifies a module's computation, without its values: class and named parameter/buffer specs."""
    cls = type(module)
    return {
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "parameters": [_tensor_entry(n, p) for n, p in module.named_parameters()],
        "buffers": [_tensor_entry(n, b) for n, b in module.named_buffers()],
        "children": [f"{n}:{type(c).__module__}.{type(c).__qualname__}" for n, c in module.named_children()],
    }


def graph_structure(spec: GraphSpec) -> dict[str, Any]:
    """The graph spec's JSON without its name (two identical modules may number the same graph differently)."""
    data = dict(spec.to_dict())
    data.pop("name", None)
    return data


def tuning_structure(strategy: Any, backends: Iterable[Backend] | None = None) -> dict[str, Any]:
    """The strategy's class and its candidates' keys: another candidate list may decide otherwise."""
    candidates = list(backends if backends is not None else getattr(strategy, "backends", []))
    keys = []
    for backend in candidates:
        try:
            keys.append(backend.key())
        except Exception:  # a backend whose key() fails is still named
            keys.append(type(backend).__name__)
    knobs = {}
    for name in _STRATEGY_KNOBS:  # thresholds that change the verdict ("stays eager") for the same candidates
        value = getattr(strategy, name, None)
        if isinstance(value, (bool, int, float, str)) or value is None:
            knobs[name] = value
    return {"strategy": type(strategy).__name__, "backends": keys, "knobs": knobs}


@lru_cache(maxsize=8)
def _environment(device_type: str, device_index: int | None) -> tuple[tuple[str, str], ...]:
    from aitune_core.checkpoint.manifest import versions

    env = {
        **versions(),  # aitune, torch, python
        "key_version": str(KEY_VERSION),
        "cuda": str(torch.version.cuda),
        "device": device_type,
    }
    if device_type == "cuda" and torch.cuda.is_available():
        index = device_index if device_index is not None else torch.cuda.current_device()
        env["gpu"] = torch.cuda.get_device_name(index)
        env["capability"] = ".".join(str(v) for v in torch.cuda.get_device_capability(index))
    return tuple(sorted(env.items()))


def environment(device: torch.device | str) -> dict[str, str]:
    """Versions and the accelerator a decision was taken on (a decision does not carry over to another GPU)."""
    device = torch.device(device)
    return dict(_environment(device.type, device.index))


def decision_key(
    module: torch.nn.Module, spec: GraphSpec, strategy: Any, device: torch.device | str
) -> tuple[str, dict[str, Any]]:
    """`(key, parts)`: the sha256 of the canonical JSON of `parts` (module, graph, tuning, environment; see the
    module docstring), and the parts themselves (readable, for `cache list` and the history)."""
    parts = {
        "module": module_structure(module),
        "graph": graph_structure(spec),
        "tuning": tuning_structure(strategy),
        "environment": environment(device),
    }
    return _digest(parts), parts
