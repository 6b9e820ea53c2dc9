"""aitune_jit/training_switch.py: a job stops when the program switches its module to training mode, and only
then; `Module.train` is patched only while jobs watch."""

from __future__ import annotations

import threading
import time

import torch
from jit_helpers import CountingBackend, make_mlp

from aitune_jit import training_switch
from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.state import NodeState
from aitune_jit.switch import enable
from aitune_jit.worker import wait_until_tuned


def _watched_from_another_thread(action) -> int:
    """Watch `model` on a thread of its own (as a job does), run `action(model)` on this thread: how often the
    watch fired."""
    model = make_mlp().eval()
    fired, watching, done = [], threading.Event(), threading.Event()

    def job() -> None:
        end = training_switch.watch(model, lambda: fired.append(True))
        watching.set()
        done.wait(10)
        end()

    thread = threading.Thread(target=job)
    thread.start()
    watching.wait(10)
    try:
        action(model)
    finally:
        done.set()
        thread.join(10)
    return len(fired)


def test_switching_the_module_or_a_submodule_to_training_fires():
    assert _watched_from_another_thread(lambda model: model.train()) > 0
    assert _watched_from_another_thread(lambda model: model.blocks[0].train()) > 0


def test_eval_another_module_and_the_jobs_own_thread_do_not():
    assert _watched_from_another_thread(lambda model: model.eval()) == 0
    assert _watched_from_another_thread(lambda model: torch.nn.Linear(2, 2).train()) == 0
    original = torch.nn.Module.train
    model = make_mlp().eval()
    fired = []
    end = training_switch.watch(model, lambda: fired.append(True))
    try:
        assert torch.nn.Module.train is not original
        model.train()  # the watching thread itself (a backend's own train/eval): not the program
    finally:
        end()
    assert fired == [] and torch.nn.Module.train is original  # the patch is off with the last watch


def test_a_job_stops_when_the_program_trains_and_tunes_again_after(monkeypatch):
    jit_config.blocking = False
    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False
    CountingBackend.build_delay_s = 1.0  # the job is inside its build when the program switches
    model = make_mlp().eval()
    enable()
    x = torch.randn(2, 32)
    with torch.no_grad():
        model(x), model(x)  # the second call queues the job
    node = PatchedModule.of(model)
    deadline = time.monotonic() + 10
    while CountingBackend.builds == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    model.train()  # the program trains now: the job's replays must not run in training mode
    assert wait_until_tuned(timeout=30)
    assert any("tuning stopped: the program switched it to training mode" in line for line in PatchedModule.history)
    assert node.state is NodeState.RECORDING and CountingBackend.infers == 0  # nothing replayed, nothing applied
    CountingBackend.build_delay_s = 0.0
    model.eval()
    with torch.no_grad():
        model(x), model(x)
    assert wait_until_tuned(timeout=30) and node.state is NodeState.TUNED
