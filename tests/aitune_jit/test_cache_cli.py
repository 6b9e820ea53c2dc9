"""`python -m aitune.torch.jit cache list|clear [--dir DIR]`."""

from __future__ import annotations

import subprocess
import sys

from aitune_core.decision_store import INDUCTOR_MARKER, Decision, DecisionStore
from aitune_jit.cache_cli import main
from aitune_jit.config import jit_config


def _fill(root):
    store = DecisionStore(root)
    store.put(Decision(key="ab" * 32, kind="backend", backend_type="TorchInductorBackend", backend_config={},
                       backend_description="TorchInductorBackend()", module="Block 📊1.1K",
                       graph="0: x float32[2..8,32]", source="MLP.blocks.0", package=f"{'ab' * 32}.pt2",
                       package_sha256="00"))
    (root / "packages").mkdir()
    (root / "packages" / f"{'ab' * 32}.pt2").write_bytes(b"p" * 3 * 1024 * 1024)
    damaged = store.put(Decision(key="cd" * 32, kind="eager", reason="graph break: data-dependent branch"))
    damaged.write_text(damaged.read_text()[:30])
    (root / "inductor" / "fxgraph").mkdir(parents=True)
    (root / "inductor" / "fxgraph" / "entry").write_bytes(b"x" * 2048)
    (root / "inductor" / INDUCTOR_MARKER).touch()  # (what `decisions.point_inductor_cache` leaves there)
    return store


def test_list_shows_each_entry_and_the_inductor_cache(tmp_path, capsys):
    _fill(tmp_path)
    assert main(["list", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for text in ("Block", "0: x float32[2..8,32]", "TorchInductorBackend()", "MLP.blocks.0", "unusable",
                 "2 decision(s)", "2.0 KiB", "(with package)", "3.0 MiB"):
        assert text in out, text


def test_clear_removes_decisions_packages_and_inductor_artifacts(tmp_path, capsys):
    store = _fill(tmp_path)
    assert main(["clear", "--dir", str(tmp_path)]) == 0
    assert "removed 2 decision(s)" in capsys.readouterr().out
    assert list(store.entries()) == [] and not (tmp_path / "inductor").exists()
    assert not (tmp_path / "packages").exists()


def test_clear_and_list_leave_files_aitune_did_not_write(tmp_path, capsys):
    # `--dir .` in a project: its own packages/, decisions/config.json and an unmarked inductor/ were deleted
    store = _fill(tmp_path)
    (tmp_path / "packages" / "mylib.py").write_text("code")
    (tmp_path / "decisions" / "config.json").write_text('{"mine": 1}')
    (tmp_path / "decisions" / "draft.tmp").write_text("keep")
    (tmp_path / "inductor" / INDUCTOR_MARKER).unlink()
    (tmp_path / "decisions" / ("ef" * 32 + ".json")).symlink_to(tmp_path / "gone")  # a dangling link
    assert main(["list", "--dir", str(tmp_path)]) == 0
    assert "config.json" not in capsys.readouterr().out
    assert main(["clear", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "left" in out and "inductor" in out
    assert (tmp_path / "packages" / "mylib.py").read_text() == "code"
    assert (tmp_path / "decisions" / "config.json").exists() and (tmp_path / "decisions" / "draft.tmp").exists()
    assert (tmp_path / "inductor" / "fxgraph" / "entry").exists()
    assert not (tmp_path / "packages" / f"{'ab' * 32}.pt2").exists() and list(store.entries()) == []


def test_the_default_folder_is_jit_config_cache_dir(tmp_path, capsys):
    jit_config.cache_dir = tmp_path
    _fill(tmp_path)
    main(["list"])
    assert str(tmp_path) in capsys.readouterr().out


def test_through_the_launcher(tmp_path):
    _fill(tmp_path)
    result = subprocess.run([sys.executable, "-m", "aitune.torch.jit", "cache", "list", "--dir", str(tmp_path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "TorchInductorBackend()" in result.stdout, result.stderr
    bad = subprocess.run([sys.executable, "-m", "aitune.torch.jit", "cache", "show"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
