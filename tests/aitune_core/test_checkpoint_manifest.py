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


def test_saving_to_a_symlink_keeps_the_link_and_leaves_no_stray_entry(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "links").mkdir()
    link = tmp_path / "links" / "ckpt"
    link.symlink_to(tmp_path / "real", target_is_directory=True)
    _write(link, "v1")
    _write(link, "v2")  # over an existing checkpoint, through the link
    assert link.is_symlink() and os.readlink(link) == str(tmp_path / "real")
    assert CheckpointReader(link).resolve("a/file.bin").read_text() == "v2"
    assert sorted(p.name for p in (tmp_path / "links").iterdir()) == ["ckpt", "src.bin"]  # (src.bin: _write's)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["links", "real"]


@pytest.mark.parametrize("version", [0, -1, True, 1.0, "1", None, FORMAT_VERSION + 1])
def test_format_version_must_be_a_known_integer(tmp_path, version):
    ckpt = _write(tmp_path / "ckpt")
    manifest = json.loads((ckpt / MANIFEST_FILE).read_text())
    manifest["format_version"] = version
    (ckpt / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match=r"format.version"):
        CheckpointReader(ckpt)


def test_version_1_checkpoints_are_still_read(tmp_path):
    ckpt = _write(tmp_path / "ckpt")
    manifest = json.loads((ckpt / MANIFEST_FILE).read_text())
    manifest["format_version"] = 1
    (ckpt / MANIFEST_FILE).write_text(json.dumps(manifest))
    CheckpointReader(ckpt).verify()


def test_symlinks_inside_the_checkpoint_are_refused(tmp_path):
    ckpt = _write(tmp_path / "ckpt")
    (tmp_path / "elsewhere").mkdir()
    os.replace(ckpt / "a" / "file.bin", tmp_path / "elsewhere" / "file.bin")
    (ckpt / "a" / "file.bin").symlink_to(tmp_path / "elsewhere" / "file.bin")  # same bytes, same checksum
    with pytest.raises(CheckpointError, match="symlink"):
        CheckpointReader(ckpt).verify()
    os.replace(ckpt / MANIFEST_FILE, tmp_path / "elsewhere" / MANIFEST_FILE)
    (ckpt / MANIFEST_FILE).symlink_to(tmp_path / "elsewhere" / MANIFEST_FILE)
    with pytest.raises(CheckpointError, match="symlink"):
        CheckpointReader(ckpt)


def test_a_checkpoint_folder_that_is_itself_a_link_is_fine(tmp_path):
    ckpt = _write(tmp_path / "ckpt")
    (tmp_path / "alias").symlink_to(ckpt, target_is_directory=True)
    reader = CheckpointReader(tmp_path / "alias")
    reader.verify()
    assert torch.equal(reader.load_torch("a/state.pt")["t"], torch.arange(3))


def test_an_unindexed_file_in_an_artifact_folder_is_refused(tmp_path):
    ckpt = _write(tmp_path / "ckpt")
    reader = CheckpointReader(ckpt)
    reader.verify()
    (ckpt / "a" / "planted.onnx_data").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="not covered by its checksums"):
        reader.resolve("a")


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch /tmp/aitune-pwned-manifest-test",))


def test_load_torch_never_unpickles_objects(tmp_path):
    from pathlib import Path

    marker = Path("/tmp/aitune-pwned-manifest-test")
    marker.unlink(missing_ok=True)
    src = tmp_path / "evil.pt"
    torch.save({"x": _Boom()}, src)
    with CheckpointWriter(tmp_path / "ckpt") as writer:
        writer.add_file(src, "evil.pt")
        writer.commit({})
    reader = CheckpointReader(tmp_path / "ckpt")
    reader.verify()
    with pytest.raises(CheckpointError, match=r"cannot load evil\.pt"):
        reader.load_torch("evil.pt")
    assert not marker.exists()
