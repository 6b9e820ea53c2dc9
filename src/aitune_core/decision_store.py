"""`DecisionStore`: tuning decisions on disk, as JSON files that several processes can share.

Layout under the store's folder (for JIT tuning: `jit_config.cache_dir`, i.e. `$AITUNE_JIT_CACHE_DIR` or
`~/.cache/aitune/jit`):

    decisions/<key>.json     one decision (see `Decision`), named by its key (`aitune_core.decision_key`)
    decisions/<key>.claim    the process tuning that graph now (`aitune_core.tuning_claim`)
    inductor/                Inductor's own caches (TORCHINDUCTOR_CACHE_DIR), when aitune chose the folder
    packages/<key>.<build>.aotc  a package of the decided graph for warm starts (`Decision.package`), opt-in;
                             `.pt2` for an AOTInductor package

Why JSON and not a pickle: a cache folder may be shared or copied between machines; no decision read from it is
ever executed (the opt-in packages are code: `aitune_jit.packaging`). A decision names a backend class and its
configuration; the backend is rebuilt from them (for Inductor, torch's caches make that cheap) and validated on
the reading process's own samples before use.

Several processes may share the folder (replicas of a server): an entry is written to a temporary file in the
same folder and moved into place with `os.replace`, so a reader sees the whole old entry, the whole new one, or
none - never half a file. Each entry carries its key and a checksum of its content; an entry that does not
parse, whose checksum or key does not match, or that names a backend that no longer exists is ignored with one
WARNING (per file) and tuned again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_logger = logging.getLogger("aitune.cache")

DECISIONS = "decisions"
INDUCTOR = "inductor"
#: the file aitune puts in the Inductor folder it chose (`cache clear` removes only such a folder)
INDUCTOR_MARKER = ".aitune-inductor-cache"
PACKAGES = "packages"
#: what a decision says: run a backend, or stay eager
KINDS = ("backend", "eager")

_warned: set[str] = set()
_warned_lock = threading.Lock()


#: the type each field of a `Decision` must have (`Decision._check_types`; None is allowed where the field's default
#: is None)
_FIELD_TYPES: dict[str, Any] = {
    "key": str, "kind": str, "backend_type": (str, type(None)), "backend_config": (dict, type(None)),
    "backend_description": (str, type(None)), "backend_path": (str, type(None)), "reason": (str, type(None)),
    "reopen": bool, "source": str, "speedup": (int, float, type(None)), "module": str, "graph": str,
    "environment": dict, "validated_samples": int, "package": (str, type(None)),
    "package_sha256": (str, type(None)), "created": (int, float),
}
_NUMBERS = frozenset({"speedup", "validated_samples", "created"})


@dataclasses.dataclass
class Decision:
    """The outcome of tuning one graph of one module, reusable by identical modules and later processes.

    - `kind`: "backend" (run `backend_type` - the class `backend_path` names, among the `Backend` subclasses
      already imported - with `backend_config`) or "eager" (`reason` says why; `reopen`
      whether the module's children may be tuned instead, e.g. after a graph break).
    - `source`: the module path whose tuning produced it; `speedup`: measured at its recorded shapes, if any.
    - `module`, `graph`: readable descriptions for `cache list`; `environment`: where it was decided.
    - `package`, `package_sha256`: a package of the module's graph for warm starts (`aitune_jit.packaging`) (a file name
      under `packages/`, and its digest), made after the decision (`aitune_jit.packaging`); None until then.
    """

    key: str
    kind: str
    backend_type: str | None = None
    backend_config: dict[str, Any] | None = None
    backend_description: str | None = None
    backend_path: str | None = None  # module.qualname of the class: two classes may share a name
    reason: str | None = None
    reopen: bool = True
    source: str = ""
    speedup: float | None = None
    module: str = ""
    graph: str = ""
    environment: dict[str, str] = dataclasses.field(default_factory=dict)
    validated_samples: int = 0
    package: str | None = None
    package_sha256: str | None = None
    created: float = dataclasses.field(default_factory=time.time)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown decision kind {self.kind!r} (expected one of {KINDS})")
        if self.kind == "backend" and (not self.backend_type or not isinstance(self.backend_config, dict)):
            raise ValueError("a backend decision needs backend_type and backend_config")
        self._check_types()

    def _check_types(self) -> None:
        """Every field of the type it is written with: an entry read from a file whose `speedup` was a string
        failed later, while its backend was built ("aitune failed while tuning it"), and one whose `module` was a
        number made `cache list` fail."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            expected = _FIELD_TYPES.get(field.name)
            wrong = expected is not None and not isinstance(value, expected)
            if wrong or (isinstance(value, bool) and field.name in _NUMBERS):
                raise ValueError(f"its field {field.name!r} is {type(value).__name__}, not {field.type}")

    def describe(self) -> str:
        if self.kind == "backend":
            return self.backend_description or str(self.backend_type)
        return f"eager ({self.reason})"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Decision:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}")
        return cls(**data)


def _checksum(payload: dict[str, Any]) -> str:
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _warn_once(path: Path, message: str) -> None:
    with _warned_lock:
        if str(path) in _warned:
            return
        _warned.add(str(path))
    _logger.warning("Ignoring aitune cache entry %s: %s; the module is tuned again", path, message)


class DecisionStore:
    """Decisions under `root / "decisions"` (see the module docstring)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root).expanduser()

    @property
    def folder(self) -> Path:
        return self.root / DECISIONS

    def path(self, key: str) -> Path:
        if not key or not all(c in "0123456789abcdef" for c in key):
            raise ValueError(f"not a decision key: {key!r}")
        return self.folder / f"{key}.json"

    def get(self, key: str) -> Decision | None:
        """The decision stored under `key`, or None (missing, or unusable: one WARNING per file)."""
        path = self.path(key)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:  # (bytes that are not UTF-8: damaged, warned like any other)
            _warn_once(path, f"cannot be read ({exc})")
            return None
        return self._parse(path, text, key)

    def _parse(self, path: Path, text: str, key: str | None) -> Decision | None:
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or not isinstance(data.get("decision"), dict):
                raise ValueError("not an aitune decision")
            payload = data["decision"]
            if data.get("checksum") != _checksum(payload):
                raise ValueError("its checksum does not match its content (edited or damaged)")
            decision = Decision.from_dict(payload)
            if key is not None and decision.key != key:
                raise ValueError(f"it holds key {decision.key[:12]}..., not {key[:12]}...")
            if path.stem != decision.key:
                raise ValueError("its file name is not its key")
        except (ValueError, TypeError) as exc:  # json.JSONDecodeError is a ValueError
            _warn_once(path, str(exc) or type(exc).__name__)
            return None
        return decision

    def put(self, decision: Decision) -> Path:
        """Write atomically (temporary file in the same folder, then `os.replace`); returns the entry's path."""
        path = self.path(decision.key)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = decision.to_dict()
        text = json.dumps({"checksum": _checksum(payload), "decision": payload}, indent=1, sort_keys=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{decision.key[:16]}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return path

    def entries(self) -> Iterator[tuple[Path, Decision | None]]:
        """Every stored entry with its decision (None when unusable), oldest file first."""
        if not self.folder.is_dir():
            return
        paths = sorted((p for p in self.folder.glob("*.json") if own_entry(p.name)), key=_modified)
        for path in paths:
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                yield path, None
                continue
            yield path, self._parse(path, text, None)

    def clear(self) -> int:
        """Remove every decision (and claims and temporary files left by killed writers); returns how many entries
        went."""
        removed = 0
        if not self.folder.is_dir():
            return 0
        for path in self.folder.iterdir():
            ours = own_entry(path.name) or _OWN_CLAIM.fullmatch(path.name) or _OWN_TEMPORARY.fullmatch(path.name)
            if ours and (path.is_file() or path.is_symlink()):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                    removed += path.suffix == ".json"
        return removed


#: the names this store writes: `<key>.json` (a SHA-256 key) and its writers' temporary files
_OWN_ENTRY = re.compile(r"[0-9a-f]{64}\.json")
_OWN_TEMPORARY = re.compile(r"\.[0-9a-f]{16}\..+\.tmp")
#: a process's claim of a graph it is tuning (`aitune_core.tuning_claim`)
_OWN_CLAIM = re.compile(r"[0-9a-f]{64}\.claim")


def own_entry(name: str) -> bool:
    """Whether a file name is one of this store's entries: `list` shows and `clear` removes only those (a
    program's own `config.json` in a cache folder given as `--dir .` was listed as unusable and then deleted)."""
    return bool(_OWN_ENTRY.fullmatch(name))


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # (a dangling link, or removed meanwhile: listed first, then as unreadable)
        return 0.0
