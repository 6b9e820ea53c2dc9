"""`compile_package`: the compile runs in a child process that does not start the JIT; failures, stops and
timeouts are build errors with the child's last lines; nothing half-written is left at the destination."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from backend_models import MLP, mlp_call, record

from aitune_core import aoti_packaging
from aitune_core.aoti_packaging import compile_package
from aitune_core.errors import BackendBuildError


def test_the_child_does_not_inherit_the_jit_bootstrap(monkeypatch):
    monkeypatch.setenv("AUTOWRAPT_BOOTSTRAP", "aitune_enable_jit_tuning")
    env = aoti_packaging._child_env()
    assert "AUTOWRAPT_BOOTSTRAP" not in env
    assert env["PYTHONPATH"].split(os.pathsep)[0].endswith("src")


def _failing_child(monkeypatch, code: str) -> None:
    real = subprocess.Popen

    def popen(command, **kwargs):
        return real([sys.executable, "-c", code], **kwargs)

    monkeypatch.setattr(aoti_packaging.subprocess, "Popen", popen)


def test_a_failing_compile_is_a_build_error_with_the_childs_output(monkeypatch, tmp_path):
    _failing_child(monkeypatch, "import sys; print('inductor said no'); sys.exit(3)")
    module = MLP().eval()
    spec, samples = record(module, mlp_call)
    dest = tmp_path / "out" / "m.pt2"
    with pytest.raises(BackendBuildError, match=r"failed \(exit status 3\) while compiling.*inductor said no"):
        compile_package(module, spec, samples, torch.device("cpu"), dest)
    assert not dest.exists() and list(dest.parent.iterdir()) == []  # the scratch folder went too


def test_a_stopped_or_slow_compile_is_killed(monkeypatch, tmp_path):
    _failing_child(monkeypatch, "import time; time.sleep(60)")
    monkeypatch.setattr(aoti_packaging, "POLL_S", 0.01)
    module = MLP().eval()
    spec, samples = record(module, mlp_call)
    with pytest.raises(BackendBuildError, match="stopped"):
        compile_package(module, spec, samples, torch.device("cpu"), tmp_path / "a.pt2", should_stop=lambda: True)
    with pytest.raises(BackendBuildError, match="longer than"):
        compile_package(module, spec, samples, torch.device("cpu"), tmp_path / "b.pt2", timeout_s=0.2)


def test_a_package_that_crashes_its_verifier_is_reported_with_the_signal(monkeypatch, tmp_path):
    """On an H100 (torch 2.11) loading a package killed the loading process; the child loads it first."""
    _failing_child(monkeypatch, "import os, signal; print('compiled; verifying the package in this process', "
                                "flush=True); os.kill(os.getpid(), signal.SIGSEGV)")
    module = MLP().eval()
    spec, samples = record(module, mlp_call)
    with pytest.raises(BackendBuildError, match=r"died of signal 11 while verifying the package"):
        compile_package(module, spec, samples, torch.device("cpu"), tmp_path / "m.pt2")
