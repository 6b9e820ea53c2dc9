"""aitune_jit/job_draws.py: what torch's compiler draws on a job's thread comes from the job's generators; the
program's streams, and every other thread's draws through the same modules, stay torch's."""

from __future__ import annotations

import importlib
import sys
import threading

import pytest
import torch

from aitune_jit import job_draws, job_rng


@pytest.fixture
def installed():
    job_draws.install()
    for name in job_draws.DRAWING_MODULES:  # (as a compile imports them)
        importlib.import_module(name)
    yield job_draws.installed()
    job_draws.uninstall()


def test_install_imports_nothing_and_a_module_imported_later_is_patched(tmp_path, monkeypatch):
    """A job's start does not import the compiler's drawing modules (their compile held up requests); each one
    gets the proxy as it is imported, and its torch back at `uninstall`."""
    (tmp_path / "aitune_late_drawer.py").write_text("import torch\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(job_draws, "DRAWING_MODULES", (*job_draws.DRAWING_MODULES, "aitune_late_drawer"))
    job_draws.install()
    try:
        assert "aitune_late_drawer" not in sys.modules
        late = importlib.import_module("aitune_late_drawer")
        assert isinstance(late.torch, job_draws.TorchForJobs)
    finally:
        job_draws.uninstall()
        sys.modules.pop("aitune_late_drawer", None)
    assert late.torch is torch


def test_a_module_imported_while_not_installed_keeps_torch(tmp_path, monkeypatch):
    (tmp_path / "aitune_idle_drawer.py").write_text("import torch\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(job_draws, "DRAWING_MODULES", (*job_draws.DRAWING_MODULES, "aitune_idle_drawer"))
    job_draws.install()
    job_draws.uninstall()
    try:
        assert importlib.import_module("aitune_idle_drawer").torch is torch  # (its hook stays, inactive)
    finally:
        sys.modules.pop("aitune_idle_drawer", None)


def _on_job_thread(fn):
    """Run `fn` on another thread marked as a job's; return what it returned."""
    box = {}

    def body() -> None:
        with job_rng.on_job_thread():
            box["value"] = fn()

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(30)
    return box["value"]


def test_the_drawing_modules_this_torch_has_see_the_proxy_and_get_torch_back(installed):
    assert "torch._inductor.fx_passes.pad_mm" in installed and "torch._dynamo.testing" in installed
    pad_mm = sys.modules["torch._inductor.fx_passes.pad_mm"]
    assert isinstance(pad_mm.torch, job_draws.TorchForJobs)
    assert pad_mm.torch.float32 is torch.float32 and pad_mm.torch.ops is torch.ops  # everything else is torch's
    assert torch.randn is not pad_mm.torch.randn  # torch itself is untouched
    job_draws.uninstall()
    assert pad_mm.torch is torch and job_draws.installed() == []


def test_a_jobs_draws_through_those_modules_leave_the_programs_generator_where_it_was(installed):
    proxy = sys.modules["torch._inductor.fx_passes.pad_mm"].torch
    rand_strided = sys.modules["torch._dynamo.testing"].rand_strided
    before = torch.get_rng_state()

    def compiler_draws() -> list[torch.Tensor]:
        proxy.manual_seed(1337)  # (torch's benchmark helpers seed before they time)
        return [proxy.randn(8), proxy.randn_like(torch.empty(2, 3).t()), proxy.rand(4), rand_strided((2, 2), (1, 2)),
                proxy.randint(0, 9, (3,))]

    drawn = _on_job_thread(compiler_draws)
    assert torch.equal(torch.get_rng_state(), before)
    assert drawn[1].shape == (3, 2) and drawn[1].stride() == (1, 3)  # a `*_like` draw keeps the layout
    torch.manual_seed(5)
    want = torch.randn(6)
    torch.manual_seed(5)
    _on_job_thread(lambda: proxy.randn(100))  # (a job draws between the program's seed and its draw)
    assert torch.equal(torch.randn(6), want)


def test_on_the_programs_threads_the_same_modules_draw_from_torchs_generators(installed):
    proxy = sys.modules["torch._inductor.fx_passes.pad_mm"].torch
    like = torch.empty(2, 3)
    torch.manual_seed(3)
    want = torch.randn(4), torch.rand_like(like)
    proxy.manual_seed(3)
    assert torch.equal(proxy.randn(4), want[0]) and torch.equal(proxy.rand_like(like), want[1])


def test_a_module_someone_else_rebound_is_left_to_them(installed):
    pad_mm = sys.modules["torch._inductor.fx_passes.pad_mm"]
    theirs = object()
    pad_mm.torch = theirs
    try:
        job_draws.uninstall()
        assert pad_mm.torch is theirs
    finally:
        pad_mm.torch = torch
