"""aitune_jit/job_module_hooks.py: a FlopCounterMode on a job's thread registers no global module hooks, so the
program's module calls on other threads run none of its tracker's code; elsewhere torch's hooks register as always."""

from __future__ import annotations

import importlib
import sys
import threading

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from aitune_jit import job_module_hooks, job_rng


@pytest.fixture
def installed():
    job_module_hooks.install()
    yield job_module_hooks.installed()
    job_module_hooks.uninstall()


def _global_hooks() -> int:
    module = torch.nn.modules.module
    return len(module._global_forward_pre_hooks) + len(module._global_forward_hooks)


def test_the_tracker_of_a_flop_count_on_a_job_thread_registers_nothing(installed):
    assert "torch.utils.module_tracker.register_module_forward_pre_hook" in installed
    seen: dict[str, object] = {}

    def job() -> None:
        with job_rng.on_job_thread(), FlopCounterMode(display=False) as counter:
            seen["hooks"] = _global_hooks()
            torch.mm(torch.randn(4, 8), torch.randn(8, 2))
        seen["flops"] = counter.get_total_flops()

    before = _global_hooks()
    thread = threading.Thread(target=job)
    thread.start()
    thread.join()
    assert seen == {"hooks": before, "flops": 2 * 4 * 8 * 2}  # (operator FLOPs are counted as before)
    assert _global_hooks() == before


def test_other_threads_register_torchs_hooks_and_count_per_module(installed):
    before = _global_hooks()
    net = torch.nn.Sequential(torch.nn.Linear(8, 2))
    with FlopCounterMode(display=False) as counter:
        assert _global_hooks() == before + 2
        net(torch.randn(4, 8))
    assert _global_hooks() == before
    assert any("Sequential" in name for name in counter.get_flop_counts())  # (the tracker saw the module)


def test_uninstall_puts_torchs_functions_back_and_a_later_import_is_patched(tmp_path, monkeypatch):
    tracker = importlib.import_module("torch.utils.module_tracker")
    original = tracker.register_module_forward_hook
    (tmp_path / "aitune_late_tracker.py").write_text(
        "from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    modules = (*job_module_hooks.TRACKING_MODULES, "aitune_late_tracker")
    monkeypatch.setattr(job_module_hooks, "TRACKING_MODULES", modules)
    job_module_hooks.install()
    try:
        assert tracker.register_module_forward_hook is not original
        assert "aitune_late_tracker" not in sys.modules  # (install imports nothing)
        late = importlib.import_module("aitune_late_tracker")
        assert getattr(late.register_module_forward_hook, "aitune_job_module_hooks", False)
    finally:
        job_module_hooks.uninstall()
        sys.modules.pop("aitune_late_tracker", None)
    assert tracker.register_module_forward_hook is original
    assert late.register_module_forward_hook is torch.nn.modules.module.register_module_forward_hook
    assert job_module_hooks.installed() == []
