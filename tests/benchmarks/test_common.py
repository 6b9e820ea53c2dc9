"""benchmarks/common.py: one header, one naming scheme, and results that stay out of the tree unless asked."""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest

from benchmarks import common


def test_result_name_is_benchmark_device_details_commit_time():
    name = common.result_name("tuned_call_overhead", "NVIDIA H200", "resnet50", "b1", commit="abc1234",
                              date="2026-11-23T07:01:02+00:00")
    assert name == "tuned_call_overhead-nvidia-h200-resnet50-b1-abc1234-20261123T070102Z.json"
    assert common.result_name("x", "CPU x86_64 x2", None, "", commit="c", date="2026-11-23T07:01:02+00:00") == (
        "x-cpu-x86-64-x2-c-20261123T070102Z.json"
    )


def test_default_results_go_to_the_ignored_local_folder(tmp_path):
    header = {"benchmark": "probe", "device": {"name": "cpu"}, "git_commit": "abc", "date": "2026-11-23T07:00:00"}
    path = common.result_path(header, "tiny")
    assert path.parent == common.LOCAL_RESULTS_DIR
    assert common.result_path(header, out=tmp_path / "mine.json") == tmp_path / "mine.json"
    ignored = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=common.REPO, check=False)
    if ignored.returncode == 128:
        pytest.skip("not a git checkout")
    assert ignored.returncode == 0, f"{path} is not ignored by git: a plain run would dirty the tree"


def test_environment_header_names_the_commit_device_and_command():
    header = common.environment("probe", "cpu", commit="feedbee")
    assert header["benchmark"] == "probe" and header["git_commit"] == "feedbee"
    assert header["device"]["type"] == "cpu" and header["device"]["name"].startswith("CPU")
    assert header["torch"] and header["date"].endswith("+00:00") and "command" in header
    assert common.git_commit() not in ("", None)


def test_parser_has_the_shared_options_and_write_result_writes_json(tmp_path, capsys):
    args = common.parser("x").parse_args(["--out", str(tmp_path / "r.json"), "--git-commit", "abc"])
    assert args.out == Path(tmp_path / "r.json") and args.git_commit == "abc"
    assert common.parser("x").parse_args([]).out is None
    written = common.write_result(tmp_path / "sub" / "r.json", {"a": 1})
    assert json.loads(written.read_text()) == {"a": 1} and "results:" in capsys.readouterr().out


def _path_edits_and_imports(path: Path) -> tuple[list[int], list[str]]:
    """Lines that change `sys.path`, and every module an import statement of `path` names."""
    edits, imported = [], []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value
            if isinstance(target, ast.Attribute) and target.attr == "path" and getattr(target.value, "id", "") == "sys":
                edits.append(node.lineno)
        elif isinstance(node, ast.Import):
            imported += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.append(node.module)
    return edits, imported


def test_no_benchmark_edits_sys_path_or_imports_jit_internals():
    """Benchmarks run as `python -m benchmarks....` against the installed package, through `aitune.torch`."""
    for path in (common.REPO / "benchmarks").rglob("*.py"):
        edits, imported = _path_edits_and_imports(path)
        assert not edits, f"{path}:{edits}: sys.path edited"
        jit = [name for name in imported if name == "aitune_jit" or name.startswith("aitune_jit.")]
        assert not jit, f"{path}: imports {jit}; use the aitune.torch API"


def test_the_check_sees_a_path_edit_and_a_jit_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import sys\nsys.path.insert(0, 'src')\nfrom aitune_jit.hook import install\n")
    assert _path_edits_and_imports(probe) == ([2], ["sys", "aitune_jit.hook"])


def test_case_options_give_model_batches_and_optional_precision():
    args = common.case_options(common.parser("x"), model="m", batches=[1, 8]).parse_args(["--batches", "2"])
    assert (args.model, args.batches, args.precision) == ("m", [2], "fp32")
    bare = common.case_options(common.parser("x"), model="m", batches=[4], precision=None).parse_args([])
    assert bare.batches == [4] and not hasattr(bare, "precision")
