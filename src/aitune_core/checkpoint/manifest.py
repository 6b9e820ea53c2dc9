"""Checkpoint folder format: a `manifest.json` plus files, every file listed with its sha256.

Layout (all paths in the manifest are POSIX paths relative to the checkpoint folder):

    <checkpoint>/manifest.json
    <checkpoint>/<whatever the caller adds: weights, backend state files, artifacts>

Manifest keys written by this module:

    format          "aitune-checkpoint"
    format_version  FORMAT_VERSION (a reader refuses newer versions)
    created         ISO-8601 UTC time of the save
    versions        {"aitune": ..., "torch": ..., "python": ...} of the saving process
    files           {relative path: {"sha256": ..., "size": ...}} for every file besides the manifest
    ...             whatever the caller puts in (e.g. "kind", "modules")

Writing is atomic: `CheckpointWriter` builds the checkpoint in a temporary folder beside the target and
swaps it in with renames, so an interrupted save leaves either the previous checkpoint or nothing, never
a half-written one. A target path that is a symlink is resolved first: the link stays, and the folder it
points to is replaced.

Trust: the checksums detect corruption, truncation, tampering with a single file, and a checkpoint that
does not match the manifest. They do not authenticate the checkpoint: whoever can rewrite the files can
rewrite the manifest too. Reading therefore never executes code from the checkpoint: the manifest is JSON,
torch files are read only with `torch.load(weights_only=True)` (tensors, dtypes and plain containers; any
other pickled object is refused), and every path stays inside the checkpoint folder: absolute paths, `..`,
NUL characters and symlinks anywhere under the folder are refused (`CheckpointError`).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from aitune_core.errors import CheckpointError

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "MIN_FORMAT_VERSION",
    "CheckpointReader",
    "CheckpointWriter",
    "FileEntry",
    "sha256_file",
    "versions",
]

_logger = logging.getLogger("aitune.checkpoint")

FORMAT_NAME = "aitune-checkpoint"
#: 2: the manifest may hold "model" (the whole model's state); version 1 checkpoints are still read
FORMAT_VERSION = 2
MIN_FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def versions() -> dict[str, str]:
    """Versions of the saving process, recorded in every manifest."""
    try:
        from importlib.metadata import version

        aitune_version = version("aitune")
    except Exception:  # not installed as a distribution (e.g. run from a source tree)
        aitune_version = "unknown"
    return {"aitune": aitune_version, "torch": torch.__version__, "python": platform.python_version()}


@dataclass(frozen=True)
class FileEntry:
    """One file of a checkpoint: its path relative to the checkpoint folder, checksum and size."""

    path: str
    sha256: str
    size: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "size": self.size}


def _check_relative(rel: str) -> str:
    """A manifest path must stay inside the checkpoint folder."""
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise CheckpointError(f"invalid path in checkpoint manifest: {rel!r}")
    pure = PurePosixPath(rel)
    if pure.is_absolute() or ".." in rel.split("/") or "\\" in rel or ":" in pure.parts[0]:
        raise CheckpointError(f"path {rel!r} in checkpoint manifest points outside the checkpoint folder")
    if pure.as_posix() in ("", ".") or pure.as_posix() == MANIFEST_FILE:
        raise CheckpointError(f"invalid path in checkpoint manifest: {rel!r}")
    return pure.as_posix()


def _inside(root: Path, rel: str) -> Path:
    """`root / rel` after checking that no part of it below `root` is a symlink and that it resolves inside `root`
    (`root` is already resolved)."""
    current = root
    for part in PurePosixPath(rel).parts:
        current = current / part
        if current.is_symlink():
            raise CheckpointError(
                f"checkpoint {root}: {rel} goes through the symlink {current.relative_to(root)}; checkpoints never "
                "contain symlinks (refused: it could point outside the checkpoint folder)"
            )
    resolved = current.resolve()
    if not resolved.is_relative_to(root):
        raise CheckpointError(f"checkpoint {root}: {rel} resolves outside the checkpoint folder")
    return current


def _resolve_target(path: str | os.PathLike) -> Path:
    """The folder a save writes: `path`, or what it points to when it is a symlink (the link itself stays)."""
    target = Path(path).expanduser().absolute()
    if target.is_symlink():
        return Path(os.path.realpath(target))
    return target


def _is_checkpoint_folder(path: Path) -> bool:
    """True when `path` holds an aitune manifest (a `manifest.json` of another tool does not count: commit deletes
    the folder it replaces)."""
    try:
        manifest = json.loads((path / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT_NAME


class CheckpointWriter:
    """Builds a checkpoint in a temporary folder; `commit(manifest)` moves it to `path` atomically.

    Use as a context manager: leaving the block with an exception removes the temporary folder and
    leaves whatever was at `path` untouched.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = _resolve_target(path)
        if self.path.exists() and not self.path.is_dir():
            raise CheckpointError(f"cannot save a checkpoint to {self.path}: it exists and is not a folder")
        if self.path.is_dir() and any(self.path.iterdir()) and not _is_checkpoint_folder(self.path):
            raise CheckpointError(
                f"cannot save a checkpoint to {self.path}: the folder is not empty and is not an aitune checkpoint "
                f"(no aitune {MANIFEST_FILE}); choose an empty or new folder"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.root = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.tmp-", dir=self.path.parent))
        self._files: dict[str, FileEntry] = {}
        self._committed = False

    # ------------------------------------------------------------------ context manager
    def __enter__(self) -> CheckpointWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._committed:
            self.abort()

    def abort(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    # ------------------------------------------------------------------ adding files
    def _register(self, rel: str) -> FileEntry:
        target = self.root / rel
        entry = FileEntry(rel, sha256_file(target), target.stat().st_size)
        self._files[rel] = entry
        return entry

    def _target(self, rel: str) -> Path:
        rel = _check_relative(rel)
        if rel in self._files or rel == MANIFEST_FILE:
            raise CheckpointError(f"checkpoint file {rel!r} written twice")
        target = self.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def unique_path(self, rel: str) -> str:
        """`rel`, or `rel` with a numeric suffix before the extension when it is taken."""
        rel = _check_relative(rel)
        candidate, n = rel, 0
        pure = PurePosixPath(rel)
        while candidate in self._files or (self.root / candidate).exists():
            n += 1
            candidate = str(pure.with_name(f"{pure.stem}_{n}{pure.suffix}"))
        return candidate

    def add_file(self, src: str | os.PathLike, rel: str) -> FileEntry:
        """Copy the file `src` into the checkpoint at `rel`."""
        target = self._target(rel)
        shutil.copyfile(src, target)
        return self._register(_check_relative(rel))

    def add_tree(self, src: str | os.PathLike, rel: str) -> list[FileEntry]:
        """Copy the folder `src` (recursively) into the checkpoint at `rel`."""
        rel = _check_relative(rel)
        src = Path(src)
        entries = []
        for file in sorted(p for p in src.rglob("*") if p.is_file()):
            entries.append(self.add_file(file, f"{rel}/{file.relative_to(src).as_posix()}"))
        return entries

    def add_path(self, src: str | os.PathLike, rel: str) -> list[FileEntry]:
        """Copy a file or a folder; raises CheckpointError when `src` does not exist."""
        src = Path(src)
        if src.is_file():
            return [self.add_file(src, rel)]
        if src.is_dir():
            return self.add_tree(src, rel)
        raise CheckpointError(f"artifact {src} does not exist; cannot copy it into the checkpoint")

    def write_torch(self, obj: Any, rel: str) -> FileEntry:
        """`torch.save(obj)` into the checkpoint at `rel` (readers load it with `weights_only=True`: only tensors,
        dtypes and plain containers of them can be read back)."""
        target = self._target(rel)
        torch.save(obj, target)
        return self._register(_check_relative(rel))

    @property
    def files(self) -> dict[str, FileEntry]:
        return dict(self._files)

    # ------------------------------------------------------------------ commit
    def commit(self, manifest: dict[str, Any]) -> Path:
        """Write `manifest.json` (with format, versions and the file index added) and swap the folder in."""
        if self._committed:
            raise CheckpointError("checkpoint already committed")
        full = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "versions": versions(),
            **manifest,
            "files": {rel: {"sha256": e.sha256, "size": e.size} for rel, e in sorted(self._files.items())},
        }
        try:
            text = json.dumps(full, indent=2, sort_keys=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"checkpoint manifest is not JSON-serializable: {exc}") from exc
        manifest_path = self.root / MANIFEST_FILE
        with open(manifest_path, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())

        backup = None
        if self.path.exists():
            backup = self.path.with_name(f".{self.path.name}.old-{uuid.uuid4().hex[:8]}")
            os.replace(self.path, backup)
        try:
            os.replace(self.root, self.path)
        except BaseException:
            if backup is not None:
                os.replace(backup, self.path)
            raise
        self._committed = True
        if backup is not None:
            shutil.rmtree(backup, ignore_errors=True)
        return self.path


def _valid_file_info(info: Any) -> bool:
    return (
        isinstance(info, dict)
        and isinstance(info.get("sha256"), str)
        and len(info["sha256"]) == 64
        and type(info.get("size")) is int
        and info["size"] >= 0
    )


class CheckpointReader:
    """Reads and verifies a checkpoint folder. Every problem raises `CheckpointError` naming the file."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path).expanduser().absolute()
        if not self.path.is_dir():
            raise CheckpointError(f"checkpoint folder {self.path} does not exist")
        self.root = self.path.resolve()  # the folder itself may be a symlink; nothing below it may be
        manifest_path = self.path / MANIFEST_FILE
        if not manifest_path.is_file() and not manifest_path.is_symlink():
            raise CheckpointError(f"{self.path} is not an aitune checkpoint: {MANIFEST_FILE} is missing")
        _inside(self.root, MANIFEST_FILE)
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise CheckpointError(f"checkpoint manifest {manifest_path} is corrupt: {exc}") from exc
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
            raise CheckpointError(f"checkpoint manifest {manifest_path} is corrupt: not an {FORMAT_NAME} manifest")
        self._check_version(manifest.get("format_version"), manifest_path)
        files = manifest.get("files")
        if not isinstance(files, dict) or not all(_valid_file_info(v) for v in files.values()):
            raise CheckpointError(f"checkpoint manifest {manifest_path} is corrupt: file index missing or malformed")
        self.manifest: dict[str, Any] = manifest
        self._files: dict[str, dict[str, Any]] = {_check_relative(rel): info for rel, info in files.items()}
        self._verified = False
        self._warn_versions()

    def _check_version(self, version: Any, manifest_path: Path) -> None:
        if type(version) is not int:
            raise CheckpointError(
                f"checkpoint manifest {manifest_path} is corrupt: format_version must be an integer, got {version!r}"
            )
        if version < MIN_FORMAT_VERSION:
            raise CheckpointError(
                f"checkpoint manifest {manifest_path} is corrupt: format_version {version} does not exist "
                f"(versions {MIN_FORMAT_VERSION}..{FORMAT_VERSION})"
            )
        if version > FORMAT_VERSION:
            raise CheckpointError(
                f"checkpoint {self.path} has format version {version}; this aitune reads up to {FORMAT_VERSION}. "
                "Upgrade aitune to load it."
            )

    def _warn_versions(self) -> None:
        saved = self.manifest.get("versions")
        saved_torch = saved.get("torch") if isinstance(saved, dict) else None
        if saved_torch and saved_torch != torch.__version__:
            _logger.warning(
                "Checkpoint %s was saved with torch %s; this process runs torch %s. Compiled artifacts may not load.",
                self.path,
                saved_torch,
                torch.__version__,
            )

    @property
    def files(self) -> dict[str, dict[str, Any]]:
        return dict(self._files)

    @property
    def verified(self) -> bool:
        """True once `verify()` passed: only then may files (or artifact paths) be handed to loaders."""
        return self._verified

    def verify(self) -> None:
        """Check that every indexed file exists and matches its sha256 (before anything is deserialized)."""
        for rel, info in self._files.items():
            file = _inside(self.root, rel)
            if not file.is_file():
                raise CheckpointError(f"checkpoint {self.path} is incomplete: {rel} is missing")
            if file.stat().st_size != info["size"]:
                raise CheckpointError(
                    f"size mismatch for {rel} in checkpoint {self.path}: expected {info['size']} bytes, found "
                    f"{file.stat().st_size}; the file is truncated or was modified after saving"
                )
            actual = sha256_file(file)
            if actual != info["sha256"]:
                raise CheckpointError(
                    f"checksum mismatch for {rel} in checkpoint {self.path}: expected {info['sha256']}, "
                    f"found {actual}; the file is corrupt or was modified after saving"
                )
        self._verified = True

    def resolve(self, rel: str) -> Path:
        """Absolute path of a file or folder that the file index covers."""
        if not isinstance(rel, str):
            raise CheckpointError(f"checkpoint {self.path}: invalid path reference {rel!r} in the manifest")
        rel = _check_relative(rel)
        if rel not in self._files and not any(name.startswith(rel + "/") for name in self._files):
            raise CheckpointError(f"checkpoint {self.path} references {rel}, which is not covered by its checksums")
        if rel not in self._files:  # a folder: everything in it must be indexed (and so verified)
            self._check_folder(rel)
        return _inside(self.root, rel)

    def _check_folder(self, rel: str) -> None:
        folder = _inside(self.root, rel)
        for item in folder.rglob("*"):
            name = item.relative_to(self.root).as_posix()
            if item.is_symlink():
                raise CheckpointError(f"checkpoint {self.path}: {name} is a symlink; checkpoints never contain any")
            if item.is_file() and name not in self._files:
                raise CheckpointError(f"checkpoint {self.path}: {name} is not covered by its checksums")

    def load_torch(self, rel: str, *, map_location: Any = None) -> Any:
        """`torch.load(weights_only=True)` of a verified file: tensors, dtypes and plain containers only; a file
        holding any other pickled object is refused (CheckpointError), never executed."""
        if not self._verified:
            raise CheckpointError("verify() the checkpoint before loading files from it")
        path = self.resolve(rel)
        if rel not in self._files:
            raise CheckpointError(f"checkpoint {self.path}: {rel} is a folder, not a file")
        try:
            return torch.load(path, weights_only=True, map_location=map_location)
        except Exception as exc:
            raise CheckpointError(
                f"cannot load {rel} from checkpoint {self.path}: {type(exc).__name__}: {exc}"
            ) from exc
