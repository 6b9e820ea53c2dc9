"""Checkpoint folder: atomic writes, file index with sha256, verification before deserialization."""

import json
import os

import pytest
import torch

from aitune_core.checkpoint.manifest import FORMAT_VERSION, MANIFEST_FILE, CheckpointReader, CheckpointWriter
from aitune_core.errors import CheckpointError


def _write(path, payload="hello", extra=None):
    src = path.parent / "src.bin"
    src.write_text(payload)
    with CheckpointWriter(path) as writer:
        writer.add_file(src, "a/file.bin")
        writer.write_torch({"t": torch.arange(3)}, "a/state.pt")
        return writer.commit({"kind": "test", **(extra or {})})


def test_roundtrip_and_manifest_fields(tmp_path):
    ckpt = _write(tmp_path / "ckpt")
    manifest = json.loads((ckpt / MANIFEST_FILE).read_text())
    assert manifest["format_version"] == FORMAT_VERSION and manifest["kind"] == "test"
    assert manifest["versions"]["torch"] == torch.__version__
    assert set(manifest["files"]) == {"a/file.bin", "a/state.pt"}
    reader = CheckpointReader(ckpt)
    reader.verify()
    assert torch.equal(reader.load_torch("a/state.pt")["t"], torch.arange(3))
    assert reader.resolve("a/file.bin").read_text() == "hello"
    assert reader.resolve("a") == ckpt / "a"  # a folder covered by the index
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ckpt")]  # no temp folders left


def test_overwrite_replaces_and_interrupted_save_keeps_previous(tmp_path):
    ckpt = _write(tmp_path / "ckpt", "v1")
    _write(tmp_path / "ckpt", "v2")
    assert CheckpointReader(ckpt).resolve("a/file.bin").read_text() == "v2"
    with pytest.raises(RuntimeError, match="boom"), CheckpointWriter(ckpt) as writer:
        writer.write_torch({}, "x.pt")
        raise RuntimeError("boom")
    assert CheckpointReader(ckpt).resolve("a/file.bin").read_text() == "v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "src.bin"]


def test_refuses_to_overwrite_a_folder_that_is_not_a_checkpoint(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "precious.txt").write_text("x")
    with pytest.raises(CheckpointError, match="not an aitune checkpoint"):
        CheckpointWriter(tmp_path / "data")


def test_refuses_to_overwrite_a_folder_whose_manifest_json_is_not_ours(tmp_path):
    # manifest.json is a common name (web apps, other tools): its presence alone must not let a save delete the folder
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / MANIFEST_FILE).write_text('{"name": "my web app"}')
    (tmp_path / "app" / "precious.txt").write_text("x")
    with pytest.raises(CheckpointError, match="not an aitune checkpoint"):
        CheckpointWriter(tmp_path / "app")
    (tmp_path / "app" / MANIFEST_FILE).write_text("not json")
    with pytest.raises(CheckpointError, match="not an aitune checkpoint"):
        CheckpointWriter(tmp_path / "app")
    assert (tmp_path / "app" / "precious.txt").read_text() == "x"


def test_missing_or_corrupt_manifest(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        CheckpointReader(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"manifest\.json is missing"):
        CheckpointReader(tmp_path / "empty")
    ckpt = _write(tmp_path / "ckpt")
    (ckpt / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match="corrupt"):
        CheckpointReader(ckpt)
    (ckpt / MANIFEST_FILE).write_text(json.dumps({"format": "aitune-checkpoint", "format_version": 1}))
    with pytest.raises(CheckpointError, match="file index"):
        CheckpointReader(ckpt)
    (ckpt / MANIFEST_FILE).write_text(json.dumps({"format": "aitune-checkpoint", "format_version": 99, "files": {}}))
    with pytest.raises(CheckpointError, match="format version 99"):
        CheckpointReader(ckpt)


def test_tampered_or_missing_file_fails_verification_and_nothing_loads_before(tmp_path):
    ckpt = _write(tmp_path / "ckpt")
    reader = CheckpointReader(ckpt)
    with pytest.raises(CheckpointError, match="verify"):
        reader.load_torch("a/state.pt")
    (ckpt / "a" / "file.bin").write_text("HELLO")
    with pytest.raises(CheckpointError, match=r"checksum mismatch for a/file.bin"):
        CheckpointReader(ckpt).verify()
    os.remove(ckpt / "a" / "file.bin")
    with pytest.raises(CheckpointError, match=r"a/file\.bin is missing"):
        CheckpointReader(ckpt).verify()


def test_paths_outside_the_checkpoint_are_rejected(tmp_path):
    ckpt = _write(tmp_path / "ckpt")
    manifest = json.loads((ckpt / MANIFEST_FILE).read_text())
    manifest["files"]["../src.bin"] = {"sha256": "0" * 64, "size": 1}
    (ckpt / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="outside the checkpoint"):
        CheckpointReader(ckpt)
    reader = CheckpointReader(_write(tmp_path / "ok"))
    with pytest.raises(CheckpointError, match="not covered by its checksums"):
        reader.resolve("other.bin")
