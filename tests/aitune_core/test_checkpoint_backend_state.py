"""Backend states in checkpoints: JSON in the manifest, Path artifacts copied and checksummed, the rest in a torch
file."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from aitune_core.backends.backend import Backend, BackendConfig, BackendState
from aitune_core.checkpoint.backend_state import (
    ARTIFACT_MARK,
    TORCH_MARK,
    pack_backend,
    resolve_backend_class,
    unpack_backend_state,
)
from aitune_core.checkpoint.manifest import MANIFEST_FILE, CheckpointReader, CheckpointWriter
from aitune_core.errors import CheckpointError


@dataclasses.dataclass(frozen=True)
class _ArtifactConfig(BackendConfig):
    dtype: torch.dtype = torch.float16
    level: int = 1


class ArtifactBackend(Backend):
    """A backend whose build writes an engine file and an engine folder, and keeps tensors in its state."""

    config_class = _ArtifactConfig

    def _build(self, module, graph_spec, data, cache_dir):
        self.engine = cache_dir / "engine.bin"
        self.engine.write_bytes(b"\x00engine")
        self.folder = cache_dir / "plans"
        (self.folder / "sub").mkdir(parents=True)
        (self.folder / "sub" / "p.txt").write_text("plan")
        self.scale = torch.tensor([0.5, 2.0])

    def _extra_state(self):
        return {"engine": self.engine, "plans": self.folder, "scale": self.scale, "shape": (2, 3), "note": "hi"}

    def _load_extra_state(self, module, state):
        self.engine, self.folder = state["engine"], state["plans"]
        self.scale, self.shape = state["scale"], state["shape"]

    def _infer(self, x):
        return x


def _built(tmp_path):
    backend = ArtifactBackend(_ArtifactConfig(level=3))
    cache = tmp_path / "cache"
    cache.mkdir()
    return backend.build(torch.nn.Identity(), None, [], torch.device("cpu"), cache)


def _save(tmp_path, backend):
    with CheckpointWriter(tmp_path / "ckpt") as writer:
        entry = pack_backend(backend, writer, "b")
        writer.commit({"backend": entry})
    return tmp_path / "ckpt", entry


def test_pack_and_unpack_roundtrip(tmp_path):
    backend = _built(tmp_path)
    ckpt, entry = _save(tmp_path, backend)
    assert entry["type"] == "ArtifactBackend" and entry["key"] == backend.key()
    assert entry["config"] == {"dtype": "torch.float16", "level": 3}
    assert entry["state"]["engine"] == {ARTIFACT_MARK: "b/artifacts/engine.bin"}
    assert TORCH_MARK in entry["state"]["scale"] and entry["state"]["note"] == "hi"
    assert {a["path"] for a in entry["artifacts"]} == {"b/artifacts/engine.bin", "b/artifacts/plans/sub/p.txt"}
    json.loads((ckpt / MANIFEST_FILE).read_text())  # the manifest is plain JSON

    reader = CheckpointReader(ckpt)
    reader.verify()
    state = unpack_backend_state(reader.manifest["backend"], reader)
    assert state["engine"] == ckpt / "b/artifacts/engine.bin" and state["engine"].read_bytes() == b"\x00engine"
    assert (state["plans"] / "sub" / "p.txt").read_text() == "plan"
    assert torch.equal(state["scale"], backend.scale) and state["shape"] == (2, 3)
    assert state["config"]["dtype"] is torch.float16

    loaded = resolve_backend_class(state["type"]).from_dict(None, state)
    assert loaded.state is BackendState.CHECKPOINT_LOADED and loaded.key() == backend.key()
    assert isinstance(loaded.engine, Path) and loaded.engine.is_absolute()


def test_missing_artifact_fails_the_save(tmp_path):
    backend = _built(tmp_path)
    backend.engine.unlink()
    with pytest.raises(CheckpointError, match=r"engine.bin does not exist"):
        _save(tmp_path, backend)
    assert not (tmp_path / "ckpt").exists()


def test_unknown_backend_type(tmp_path):
    with pytest.raises(CheckpointError, match=r"unknown backend.*NoSuchBackend"):
        resolve_backend_class("NoSuchBackend")


class _PathOnlyBackend(Backend):
    """A backend whose whole state is JSON plus one artifact: unpacking it needs no torch.load."""

    def _build(self, module, graph_spec, data, cache_dir):
        self.engine = cache_dir / "engine.bin"
        self.engine.write_bytes(b"engine")

    def _extra_state(self):
        return {"engine": self.engine}

    def _infer(self, x):
        return x


def test_unpack_refuses_an_unverified_checkpoint(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    backend = _PathOnlyBackend().build(torch.nn.Identity(), None, [], torch.device("cpu"), cache)
    ckpt, entry = _save(tmp_path, backend)
    assert entry["state_file"] is None  # nothing for load_torch's own verify() check to catch
    (ckpt / "b/artifacts/engine.bin").write_bytes(b"tampered")
    with pytest.raises(CheckpointError, match="verify"):
        unpack_backend_state(entry, CheckpointReader(ckpt))
