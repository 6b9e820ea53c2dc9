"""Store a backend's `to_dict()` in a checkpoint: JSON in the manifest, artifacts copied, the rest in a torch file.

`Backend.to_dict()` returns a dict whose values are
- JSON values (None, bool, int, str, finite float, lists, dicts with str keys): kept in the manifest;
- `pathlib.Path` values: artifacts. The file or folder is copied into the checkpoint and the value is
  replaced by a marker with its checkpoint-relative path; loading gives back the absolute path inside the
  loaded checkpoint, after its sha256 was verified;
- tuples: kept in the manifest as a marked list (so Paths inside them are still artifacts);
- tensors, dtypes, devices, `torch.Size` (and dicts, OrderedDicts, lists and tuples of them): moved into one
  `torch.save` file per backend and replaced by a marker. That file is read with `torch.load(weights_only=True)`,
  after the checkpoint's checksums were verified, so it can never execute code;
- anything else (an arbitrary object) cannot be stored: `save()` raises CheckpointError naming the value.
  A backend stores a third-party object as JSON (e.g. torchao configs through torchao's own `config_to_dict`)
  or as an artifact file that only its own non-pickle loader reads.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from aitune_core.backends.backend import to_jsonable
from aitune_core.errors import CheckpointError

if TYPE_CHECKING:
    from aitune_core.backends.backend import Backend
    from aitune_core.checkpoint.manifest import CheckpointReader, CheckpointWriter

__all__ = ["ARTIFACT_MARK", "TORCH_MARK", "TUPLE_MARK", "pack_backend", "resolve_backend_class", "unpack_backend_state"]

ARTIFACT_MARK = "__aitune_artifact__"
TORCH_MARK = "__aitune_torch__"
TUPLE_MARK = "__aitune_tuple__"
_MARKS = (ARTIFACT_MARK, TORCH_MARK, TUPLE_MARK)


def _is_plain_json(value: Any) -> bool:
    if value is None or type(value) in (bool, int, str):
        return True
    return type(value) is float and math.isfinite(value)


_TORCH_SAFE_LEAVES = (torch.Tensor, torch.dtype, torch.device, torch.Size, bool, int, float, str, bytes, type(None))


def _torch_safe(value: Any) -> bool:
    """True when `torch.load(weights_only=True)` reads `value` back (checked before saving, not after loading)."""
    if isinstance(value, _TORCH_SAFE_LEAVES):
        return True
    if type(value) in (dict, OrderedDict):
        return all(isinstance(k, (str, int)) and _torch_safe(v) for k, v in value.items())
    if type(value) in (list, tuple):
        return all(_torch_safe(v) for v in value)
    return False


def pack_backend(backend: Backend, writer: CheckpointWriter, folder: str) -> dict[str, Any]:
    """Write `backend.to_dict()` under `folder` of the checkpoint; returns the manifest entry."""
    state = backend.to_dict()
    if not isinstance(state, dict) or "type" not in state:
        raise CheckpointError(f"{backend.describe()}.to_dict() must return a dict with a 'type' key")
    side: dict[str, Any] = {}
    artifacts: list[dict[str, Any]] = []

    def pack(value: Any) -> Any:
        if isinstance(value, Path):
            rel = writer.unique_path(f"{folder}/artifacts/{value.name or 'artifact'}")
            artifacts.extend(entry.to_dict() for entry in writer.add_path(value, rel))
            return {ARTIFACT_MARK: rel}
        if _is_plain_json(value):
            return value
        if type(value) is dict and all(isinstance(k, str) for k in value) and not any(m in value for m in _MARKS):
            return {k: pack(v) for k, v in value.items()}
        if type(value) is list:
            return [pack(v) for v in value]
        if type(value) is tuple:
            return {TUPLE_MARK: [pack(v) for v in value]}
        if not _torch_safe(value):
            raise CheckpointError(
                f"{backend.describe()}.to_dict() holds a {type(value).__module__}.{type(value).__qualname__}, which a "
                "checkpoint cannot store safely (loading never unpickles objects): return JSON values, tensors, "
                "dtypes or pathlib.Path artifacts"
            )
        key = f"v{len(side)}"
        side[key] = value
        return {TORCH_MARK: key}

    packed = pack(state)
    state_file = writer.write_torch(side, f"{folder}/state.pt").path if side else None
    return {
        "type": state["type"],
        "key": backend.key(),
        "description": backend.describe(),
        "config": to_jsonable(state.get("config")),  # for people reading the manifest; `state` is what loads
        "state": packed,
        "state_file": state_file,
        "artifacts": artifacts,
    }


def unpack_backend_state(entry: dict[str, Any], reader: CheckpointReader) -> dict[str, Any]:
    """Rebuild the `to_dict()` value of a backend entry; the reader must have verified the checkpoint."""
    if not isinstance(entry, dict) or "state" not in entry or "type" not in entry:
        raise CheckpointError(f"checkpoint {reader.path}: malformed backend entry in the manifest")
    if not reader.verified:  # artifact paths go straight to engine/model loaders: never hand out unchecked files
        raise CheckpointError(f"checkpoint {reader.path}: verify() the checkpoint before unpacking backend states")
    side: dict[str, Any] = {}
    state_file = entry.get("state_file")
    if state_file is not None:
        if not isinstance(state_file, str):
            raise CheckpointError(f"checkpoint {reader.path}: malformed state_file {state_file!r} in the manifest")
        side = reader.load_torch(state_file)  # weights_only=True: never executes code
        if not isinstance(side, dict):
            raise CheckpointError(f"checkpoint {reader.path}: {state_file} does not hold a backend state")

    def mark(value: dict[str, Any], name: str, kind: type) -> Any:
        if len(value) != 1 or not isinstance(value[name], kind):
            raise CheckpointError(f"checkpoint {reader.path}: malformed {name} marker in a backend state")
        return value[name]

    def unpack(value: Any) -> Any:
        if isinstance(value, list):
            return [unpack(v) for v in value]
        if not isinstance(value, dict):
            return value
        if ARTIFACT_MARK in value:
            return reader.resolve(mark(value, ARTIFACT_MARK, str))
        if TORCH_MARK in value:
            key = mark(value, TORCH_MARK, str)
            if key not in side:
                raise CheckpointError(f"checkpoint {reader.path}: backend state value {key!r} is missing")
            return side[key]
        if TUPLE_MARK in value:
            return tuple(unpack(v) for v in mark(value, TUPLE_MARK, list))
        return {k: unpack(v) for k, v in value.items()}

    state = unpack(entry["state"])
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {reader.path}: malformed backend state in the manifest")
    return state


def resolve_backend_class(type_name: Any) -> type[Backend]:
    """The Backend class named in a checkpoint (see `aitune_core.backends.registry`)."""
    from aitune_core.backends.registry import backend_class

    if not isinstance(type_name, str):
        raise CheckpointError(f"checkpoint names a backend type that is not a string: {type_name!r}")
    try:
        found = backend_class(type_name)
    except KeyError as exc:
        raise CheckpointError(f"checkpoint names an unknown backend: {exc.args[0]}") from None
    if not found.checkpointable:
        raise CheckpointError(f"checkpoint names {type_name}, which loads code files and is never restored from a "
                              "checkpoint")
    return found
