"""aitune_core/backends/cudagraph_threads.py: a thread that did not import Inductor's CUDA-graph trees gets tree
managers of its own instead of torch 2.11's bare `AssertionError`, checked on a module that behaves as 2.11's."""

from __future__ import annotations

import importlib
import sys
import threading
import types

import pytest
import torch

from aitune_core.backends import cudagraph_threads

#: what torch 2.11's module does: state for the importing thread only, and an assertion for every other thread
TORCH_2_11 = '''
import threading
import torch
local = threading.local()
local.tree_manager_containers = {}
local.tree_manager_locks = {}

def get_obj(local, attr_name):
    if hasattr(local, attr_name):
        return getattr(local, attr_name)
    else:
        assert torch._C._is_key_in_tls(attr_name)
        return torch._C._get_obj_in_tls(attr_name)

def get_container(device_index):
    containers = get_obj(local, "tree_manager_containers")
    return containers.setdefault(device_index, object())
'''


def _in_thread(fn):
    box: dict[str, object] = {}

    def body() -> None:
        try:
            box["value"] = fn()
        except AssertionError as exc:
            box["error"] = exc

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    return box


@pytest.fixture
def old_trees(monkeypatch):
    """The 2.11-like module, run on a thread of its own (its state is that thread's, not this one's), standing
    where torch's module is while the test runs."""
    cudagraph_threads.uninstall()  # (a test elsewhere may have patched torch's own module)
    module = types.ModuleType("aitune_test_trees")
    _in_thread(lambda: exec(TORCH_2_11, module.__dict__))
    monkeypatch.setitem(sys.modules, cudagraph_threads.MODULE, module)
    yield module
    cudagraph_threads.uninstall()


def test_without_the_patch_another_thread_fails_as_on_torch_2_11(old_trees):
    assert "error" in _in_thread(lambda: old_trees.get_container(0))


def test_with_the_patch_each_thread_gets_tree_managers_of_its_own(old_trees):
    cudagraph_threads.install()
    assert cudagraph_threads.installed()
    first, second = _in_thread(lambda: old_trees.get_container(0)), _in_thread(lambda: old_trees.get_container(0))
    assert "error" not in first and "error" not in second
    assert first["value"] is not second["value"]  # (each thread's own, as the importing thread always had)
    cudagraph_threads.uninstall()
    assert "error" in _in_thread(lambda: old_trees.get_container(0))  # (the module's own function is back)


def test_other_attributes_are_left_to_the_module(old_trees):
    cudagraph_threads.install()
    assert "error" in _in_thread(lambda: old_trees.get_obj(old_trees.local, "something_else"))


def test_installed_on_torchs_module_another_thread_gets_a_container():
    trees = importlib.import_module("torch._inductor.cudagraph_trees")
    cudagraph_threads.install()
    try:
        assert getattr(trees.get_obj, "aitune_any_thread", False)
        box = _in_thread(lambda: trees.get_container(0))
        assert type(box.get("value")).__name__ == "TreeManagerContainer"
    finally:
        cudagraph_threads.uninstall()
    assert not getattr(trees.get_obj, "aitune_any_thread", False)
    assert torch._C._is_key_in_tls("tree_manager_containers")  # (this thread's state is the module's own)


CROSS_THREAD_COMPILE = '''
import sys, threading, torch
import torch._inductor.cudagraph_trees  # (this thread imports the trees first, as a program of its own may)
from aitune_core.backends import cudagraph_threads
if sys.argv[1] == "patched":
    cudagraph_threads.install()
net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()).cuda().eval()
x = torch.randn(4, 16, device="cuda")
box = {}
def job():
    try:
        compiled = torch.compile(net, mode="reduce-overhead")
        with torch.no_grad():
            for _ in range(3):
                out = compiled(x)
        box["diff"] = float((out - net(x)).abs().max())
    except Exception as exc:
        box["error"] = type(exc).__name__
thread = threading.Thread(target=job)
thread.start()
thread.join()
print(box)
'''


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_second_thread_compiles_with_cuda_graphs(tmp_path):
    """On the GPU: the thread that did not import the trees compiles and replays a reduce-overhead graph; without
    the patch it fails where torch asserts (2.11), and works where torch sets the thread up itself."""
    import subprocess
    import sys

    script = tmp_path / "cross_thread.py"
    script.write_text(CROSS_THREAD_COMPILE)
    runs = {how: subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, timeout=600)
            for how in ("patched", "plain")}
    patched = runs["patched"].stdout.strip().splitlines()[-1]
    assert "'diff'" in patched and "error" not in patched, runs["patched"].stderr[-2000:]
    plain = runs["plain"].stdout.strip().splitlines()[-1]
    assert "'diff'" in plain or "AssertionError" in plain, runs["plain"].stderr[-2000:]
