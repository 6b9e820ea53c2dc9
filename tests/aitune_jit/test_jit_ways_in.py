"""The four ways in (acceptance 1 and 5): env var, import line, decorator, launcher; and the bootstrap.

Acceptance 1 runs one unmodified script (examples/resnet_app.py, the demo's small ResNet) three ways with
the default configuration (Torch Inductor on the CPU): the root is TUNED, every other node DETACHED, and the
outputs at a batch size the recordings never had (3; recorded: 2 and 8) match eager.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aitune_jit import bootstrap
from aitune_jit.decorator import patch_for_jit_tuning
from aitune_jit.patched_module import PatchedModule

SCRIPTS = Path(__file__).parent / "scripts"
REPORT_AFTER = SCRIPTS / "report_after.py"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
APP = EXAMPLES / "resnet_app.py"
APP_ARGS = ["--requests", "3", "--batch", "3"]  # batch 3: never recorded (the first requests are 2 and 8)
sys.path.insert(0, str(EXAMPLES))

import resnet_app  # noqa: E402


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "AUTOWRAPT_BOOTSTRAP" and not k.startswith("AITUNE_JIT_")}
    env["AITUNE_JIT_CACHE_DIR"] = str(tmp_path / "jit-cache")
    env.update(extra)
    return env


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def _report(result: subprocess.CompletedProcess[str]) -> dict:
    lines = [line for line in result.stdout.splitlines() if line.startswith("JIT-REPORT ")]
    assert len(lines) == 1, result.stdout[-2000:]
    return json.loads(lines[0][len("JIT-REPORT ") :])


def _assert_root_tuned_children_detached(hierarchy: list[str]) -> None:
    assert hierarchy[0] == "JIT Tuning Hierarchy:"
    assert hierarchy[1].startswith("├─ ResNet 📊320.4K level=0🪜 state=tuned🎯 (TorchInductorBackend) call_count=")
    children = hierarchy[2:]
    assert len(children) == 35  # convs, batch norms, relus, blocks, pool, fc (containers are not nodes)
    assert all("state=detached☑️" in line for line in children), "\n".join(hierarchy)


def _assert_outputs_match_eager(out: Path) -> None:
    saved = torch.load(out)
    model = resnet_app.build_model()  # no hook here: the fixture switched everything off
    with torch.no_grad():
        for x, output in zip(saved["inputs"], saved["outputs"], strict=True):
            assert x.shape[0] == 3
            torch.testing.assert_close(output, model(x), rtol=1e-3, atol=1e-4)


@pytest.mark.slow
def test_env_var_way(tmp_path):
    out = tmp_path / "out.pt"
    env = _env(tmp_path, AUTOWRAPT_BOOTSTRAP="aitune_enable_jit_tuning")
    result = _run([str(REPORT_AFTER), str(APP), "--out", str(out), *APP_ARGS], env)
    report = _report(result)
    _assert_root_tuned_children_detached(report["hierarchy"])
    _assert_outputs_match_eager(out)
    assert any(line.startswith("No graph breaks in ResNet") for line in report["history"])
    # the WARNING summary at interpreter exit
    assert "aitune JIT tuning summary: 1 module(s) tuned" in result.stderr
    assert "🎯 ResNet (ResNet 📊320.4K, level 0): TorchInductorBackend(fullgraph=True)" in result.stderr


def test_without_the_env_var_nothing_is_patched(tmp_path):
    out = tmp_path / "out.pt"
    report = _report(_run([str(REPORT_AFTER), str(APP), "--out", str(out), *APP_ARGS], _env(tmp_path)))
    assert report == {"hierarchy": ["JIT Tuning Hierarchy:"], "history": []}


@pytest.mark.slow
def test_import_line_way(tmp_path):
    script = tmp_path / "resnet_app_with_import.py"
    script.write_text("import aitune.torch.jit.enable  # noqa: F401\n" + APP.read_text())
    out = tmp_path / "out.pt"
    report = _report(_run([str(REPORT_AFTER), str(script), "--out", str(out), *APP_ARGS], _env(tmp_path)))
    _assert_root_tuned_children_detached(report["hierarchy"])
    _assert_outputs_match_eager(out)


@pytest.mark.slow
def test_decorator_way(tmp_path):
    from aitune_jit.config import jit_config

    jit_config.cache_dir = tmp_path / "jit-cache"
    create = patch_for_jit_tuning(resnet_app.build_model)
    model = create()
    out = tmp_path / "out.pt"
    resnet_app.serve(model, str(out), requests=3, batch=3)
    lines: list[str] = []
    PatchedModule.print_hierarchy(sink=lines.append)
    assert PatchedModule.of(model).reason is None, PatchedModule.history[-6:]  # (why it is not tuned, if so)
    _assert_root_tuned_children_detached(lines)
    _assert_outputs_match_eager(out)


def test_launcher_way(tmp_path):
    """`python -m aitune.torch.jit --print-hierarchy script.py args`: argv, sys.path[0], exit code, hierarchy."""
    script = tmp_path / "app.py"
    script.write_text(
        "import sys, torch\n"
        "import helper_next_to_script\n"  # sys.path[0] is the script's folder
        "model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()).eval()\n"
        "class Root(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__(); self.body = model\n"
        "    def forward(self, x): return self.body(x)\n"
        "root = Root().eval()\n"
        "with torch.no_grad():\n"
        "    for b in (2, 4, 3): root(torch.randn(b, 64))\n"
        "print('ARGV', sys.argv)\n"
        "sys.exit(int(sys.argv[2]))\n"
    )
    (tmp_path / "helper_next_to_script.py").write_text("")
    env = _env(tmp_path, AITUNE_JIT_BACKENDS="TorchEagerBackend", AITUNE_JIT_DETECT_GRAPH_BREAKS="0")
    result = subprocess.run(
        [sys.executable, "-m", "aitune.torch.jit", "--print-hierarchy", str(script), "--flag", "3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(SCRIPTS),
    )
    assert result.returncode == 3, result.stderr[-3000:]
    assert f"ARGV ['{script}', '--flag', '3']" in result.stdout
    lines = result.stdout.splitlines()
    start = lines.index("JIT Tuning Hierarchy:")
    assert lines[start + 1].startswith("├─ Root 📊4.2K level=0🪜 state=tuned🎯 (TorchEagerBackend)")
    assert lines[start + 2].startswith("   ├─ Linear 📊4.2K level=1🪜 state=detached☑️")


def test_launcher_usage_errors(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "aitune.torch.jit", str(tmp_path / "missing.py")],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "can't open file" in result.stderr


def test_bootstrap_entry_point_is_declared_and_never_raises(monkeypatch, caplog):
    from importlib.metadata import entry_points

    (entry,) = [e for e in entry_points(group="aitune_enable_jit_tuning") if e.name == "torch"]
    assert entry.value == "aitune_jit.bootstrap:enable_on_torch_import"
    assert entry.load() is bootstrap.enable_on_torch_import

    import aitune_jit.switch

    def broken() -> None:
        raise RuntimeError("cannot patch")

    monkeypatch.setattr(aitune_jit.switch, "enable", broken)
    with caplog.at_level(logging.ERROR, logger="aitune.jit"):
        bootstrap.enable_on_torch_import(torch)  # must not raise
    assert any("could not be enabled" in r.getMessage() for r in caplog.records)


WARNS = (
    "import logging\n"
    "import torch  # noqa: F401\n"
    "for _ in range(3):\n"
    "    logging.getLogger('aitune.jit').warning('a cause %s', 'X')\n"
)


def test_warnings_reach_stderr_once_per_cause_in_an_unmodified_script(tmp_path):
    script = tmp_path / "warns.py"
    script.write_text(WARNS)
    env = _env(tmp_path, AUTOWRAPT_BOOTSTRAP="aitune_enable_jit_tuning", AITUNE_JIT_STRATEGY="x")
    err = _run([str(script)], env).stderr
    assert err.count("[aitune] WARNING: a cause X") == 1, err
    assert err.count("AITUNE_JIT_STRATEGY is ignored") == 1, err  # warned while the JIT config was read
    # an application that configured logging sees every record through its own handlers, none of ours
    script.write_text("import logging\nlogging.basicConfig()\n" + WARNS)
    err = _run([str(script)], env).stderr
    assert err.count("WARNING:aitune.jit:a cause X") == 3 and "[aitune]" not in err, err


INFO_TO_STDOUT = """
import logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(name)s %(message)s")
import torch
model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
with torch.no_grad():
    for _ in range(3):
        model(torch.ones(2, 4))
logging.getLogger("app").info("served")
"""


def test_a_program_logging_info_to_stdout_gets_no_aitune_lines_there(tmp_path):
    script = tmp_path / "info.py"
    script.write_text(INFO_TO_STDOUT)
    env = _env(tmp_path, AUTOWRAPT_BOOTSTRAP="aitune_enable_jit_tuning", AITUNE_JIT_BLOCKING="1",
               AITUNE_JIT_MIN_SAMPLES="2")
    env.pop("AITUNE_LOG_LEVEL", None)
    lines = _run([str(script)], env).stdout.splitlines()
    assert "INFO app served" in lines
    # of aitune's, only the WARNING summary at exit (INFO progress lines: none)
    assert [line for line in lines if "aitune" in line and not line.startswith("WARNING aitune")] == [], lines
    env["AITUNE_LOG_LEVEL"] = "INFO"  # asked for: the progress lines come back
    assert any(line.startswith("INFO aitune.") for line in _run([str(script)], env).stdout.splitlines())
