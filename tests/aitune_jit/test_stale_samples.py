"""A module changed while it is tuned: its candidates' validation failure is neither shared nor stored, nor warned
about as the backend's fault, and its calls are recorded anew."""

from __future__ import annotations

import logging
import threading

import torch
from jit_helpers import CountingBackend, WrongValuesBackend, make_mlp, run

from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.stale_samples import STALE
from aitune_jit.state import NodeState
from aitune_jit.switch import enable
from aitune_jit.worker import wait_until_tuned


def _stored(kind: str) -> list[str]:
    folder = jit_config.cache_dir / "decisions"
    return [p.name for p in folder.glob("*.json") if f'"kind": "{kind}"' in p.read_text()] if folder.exists() else []


def _background(backend) -> None:
    jit_config.blocking = False
    jit_config.backends = [backend]
    jit_config.detect_graph_breaks = False
    jit_config.min_parameters = 0


def _candidate_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "❌ backend" in r.getMessage()]


def test_weights_reloaded_during_a_job_leave_no_eager_decision_behind(caplog):
    caplog.set_level(logging.DEBUG, logger="aitune")
    _background(CountingBackend())
    building = threading.Event()
    original_build = CountingBackend._build

    def slow_build(self, *args):  # the program reloads its weights while the job builds
        building.set()
        CountingBackend.build_delay_s = 0.5
        original_build(self, *args)

    CountingBackend._build = slow_build
    try:
        model = make_mlp()
        enable()
        run(model, [2, 3])
        assert building.wait(30)
        model.load_state_dict(make_mlp(seed=1).state_dict())
        assert wait_until_tuned(timeout=30)
    finally:
        CountingBackend._build = original_build
    node = PatchedModule.of(model)
    assert any(STALE in h and "recording its calls again" in h for h in PatchedModule.history), PatchedModule.history
    assert node.state is NodeState.RECORDING and _stored("eager") == []
    assert _candidate_warnings(caplog) == [], "the stale samples' failure is not the backend's: DEBUG only"
    assert any("❌ backend" in r.getMessage() and r.levelno == logging.DEBUG for r in caplog.records)
    torch.testing.assert_close(run(model, [2, 3]), run(make_mlp(seed=1), [2, 3]))  # the new weights' answers
    assert wait_until_tuned(timeout=30)
    assert node.state is NodeState.TUNED, node.reason  # tuned from the calls recorded with the new weights
    torch.testing.assert_close(run(model, [2, 3]), run(make_mlp(seed=1), [2, 3]))


def test_a_backend_that_is_wrong_on_an_unchanged_module_is_still_remembered(caplog):
    caplog.set_level(logging.DEBUG, logger="aitune")
    _background(WrongValuesBackend())
    model = make_mlp()
    enable()
    run(model, [2, 3])
    assert wait_until_tuned(timeout=30)
    assert not any(STALE in h for h in PatchedModule.history)
    assert _stored("eager")  # the failure holds for this module: later processes skip it
    # a backend that is wrong is said once, in the node's reason (the summary's line), not as a WARNING mid-run
    assert _candidate_warnings(caplog) == []
    assert "WrongValuesBackend" in (PatchedModule.of(model).reason or "")
