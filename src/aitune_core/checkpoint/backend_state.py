"""Store a backend's `to_dict()` in a checkpoint: JSON in the manifest, artifacts copied, the rest in a torch file.

`Backend.to_dict()` returns a dict whose values are
- JSON values (None, bool, int, str, finite float, lists, dicts with str keys): kept in the manifest;
- `pathlib.Path` values: artifacts. The file or folder is copied into the checkpoint and the value is
  replaced by a marker with its checkpoint-relative path; loading gives back the absolute path inside the
  loaded checkpoint, after its sha256 was verified;
- tuples: kept in the manifest as a marked list (so Paths inside them are still artifacts);
- anything else (tensors, dtypes, third-party config objects, OrderedDict state dicts): moved into one
  `torch.save` file per backend and replaced by a marker. That file is read with
  `torch.load(weights_only=False)`, only after the checkpoint's checksums were verified (see the trust
  note in `manifest.py`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    if entry.get("state_file"):
        side = reader.load_torch(entry["state_file"], weights_only=False)
        if not isinstance(side, dict):
            raise CheckpointError(f"checkpoint {reader.path}: {entry['state_file']} does not hold a backend state")

    def unpack(value: Any) -> Any:
        if isinstance(value, list):
            return [unpack(v) for v in value]
        if not isinstance(value, dict):
            return value
        if ARTIFACT_MARK in value:
            return reader.resolve(value[ARTIFACT_MARK])
        if TORCH_MARK in value:
            key = value[TORCH_MARK]
            if key not in side:
                raise CheckpointError(f"checkpoint {reader.path}: backend state value {key!r} is missing")
            return side[key]
        if TUPLE_MARK in value:
            return tuple(unpack(v) for v in value[TUPLE_MARK])
        return {k: unpack(v) for k, v in value.items()}

    state = unpack(entry["state"])
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {reader.path}: malformed backend state in the manifest")
    return state


def resolve_backend_class(type_name: str) -> type[Backend]:
    """The Backend class named in a checkpoint (see `aitune_core.backends.registry`)."""
    from aitune_core.backends.registry import backend_class

    try:
        return backend_class(type_name)
    except KeyError as exc:
        raise CheckpointError(f"checkpoint names an unknown backend: {exc.args[0]}") from None
