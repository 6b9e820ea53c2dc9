"""Replicas sharing a cache folder: a graph another live process is tuning is not tuned here; its decision is reused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from jit_helpers import CountingBackend, make_mlp, run

from aitune_core import tuning_claim
from aitune_core.decision_store import DecisionStore
from aitune_jit import decisions, replica_claims, summary
from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.runtime import bypassed
from aitune_jit.state import NodeState
from aitune_jit.switch import disable, enable
from aitune_jit.worker import wait_until_tuned

BATCHES = [2, 3, 2, 3]


def _settings() -> None:
    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False
    jit_config.min_parameters = 0


def _decision_of_another_process(tmp_path):
    """What another replica stores for the MLP's graph: tuned in a cache folder of its own; returns (key, file)."""
    shared = jit_config.cache_dir
    jit_config.cache_dir = tmp_path / "other-replica"
    _settings()
    enable()
    run(make_mlp(), BATCHES)
    disable()
    jit_config.cache_dir = shared
    decisions.reset()  # (this process must not remember it: the other one took it)
    CountingBackend.reset_counts()
    PatchedModule.clear_history()
    [(path, decision)] = [(p, d) for p, d in DecisionStore(tmp_path / "other-replica").entries()
                          if d.module.startswith("MLP")]
    return decision.key, path


def _claim_as_another_process(key: str):
    path = tuning_claim.claim_path(DecisionStore(jit_config.cache_dir).folder, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": 1, "host": tuning_claim.host_id(), "started": time.time(),
                                "expires": time.time() + 600}))
    return path


def _serve(model, batches=BATCHES):
    with bypassed():  # (the reference is not a module aitune tunes)
        reference = run(make_mlp(), batches)
    outputs = run(model, batches)
    assert wait_until_tuned(timeout=30)
    for out, ref in zip(outputs, reference):
        torch.testing.assert_close(out, ref)


@pytest.fixture
def waiting_replica(tmp_path, monkeypatch):
    """A background-mode process whose MLP graph another live process (pid 1) claimed; yields (model, key,
    the other process's decision file, its claim file)."""
    monkeypatch.setattr(replica_claims, "POLL_S", 0.05)
    key, stored = _decision_of_another_process(tmp_path)
    claim = _claim_as_another_process(key)
    jit_config.blocking = False
    enable()
    model = make_mlp()
    _serve(model)
    yield model, key, stored, claim


def test_a_graph_another_process_tunes_waits_then_reuses_its_decision(waiting_replica):
    model, _key, stored, claim = waiting_replica
    node = PatchedModule.of(model)
    assert node.state is NodeState.RECORDING and CountingBackend.builds == 0, PatchedModule.history
    assert any("process 1 on this host" in h for h in PatchedModule.history), "\n".join(PatchedModule.history)
    _serve(model)  # still claimed, no decision: still waiting, the answers stay the original module's
    assert node.state is NodeState.RECORDING and CountingBackend.builds == 0
    assert any("waiting at exit for another process's tuning" in line and "MLP" in line
               for line in summary.summary_lines())
    shutil.copy(stored, DecisionStore(jit_config.cache_dir).folder / stored.name)  # the other process publishes
    claim.unlink()  # ... and lets go
    time.sleep(0.1)
    _serve(model)
    assert node.state is NodeState.TUNED
    assert CountingBackend.builds == 1  # the decided backend only: no strategy ran here
    assert any("reused the decision of MLP from the cache" in h for h in PatchedModule.history)
    assert not any(h.startswith("Tuning MLP") for h in PatchedModule.history)
    assert not any("waiting at exit" in line for line in summary.summary_lines())


def test_a_holder_that_ends_without_a_decision_lets_this_process_tune(waiting_replica):
    model, _key, _stored, claim = waiting_replica
    claim.unlink()
    time.sleep(0.1)
    _serve(model)
    assert PatchedModule.of(model).state is NodeState.TUNED
    assert any(h.startswith("Tuning MLP") for h in PatchedModule.history)
    assert not list(DecisionStore(jit_config.cache_dir).folder.glob("*.claim"))  # its own claim was let go


def test_the_tuning_process_holds_the_claim_while_it_tunes_and_then_lets_go(monkeypatch):
    _settings()
    seen = []
    real_build = CountingBackend._build

    def build(self, *args, **kwargs):
        seen.extend(tuning_claim.held())
        return real_build(self, *args, **kwargs)

    monkeypatch.setattr(CountingBackend, "_build", build)
    jit_config.blocking = False
    enable()
    model = make_mlp()
    _serve(model)
    assert PatchedModule.of(model).state is NodeState.TUNED
    assert seen and all(path.suffix == ".claim" for path in seen)
    assert tuning_claim.held() == [] and not list(DecisionStore(jit_config.cache_dir).folder.glob("*.claim"))


@pytest.mark.parametrize("setting", ["blocking", "wait_for_replicas off"])
def test_blocking_mode_and_the_switch_do_not_wait(tmp_path, setting):
    key, _stored = _decision_of_another_process(tmp_path)
    claim = _claim_as_another_process(key)
    _settings()
    if setting == "blocking":
        jit_config.blocking = True
    else:
        jit_config.blocking, jit_config.wait_for_replicas = False, False
    enable()
    model = make_mlp()
    _serve(model)
    assert PatchedModule.of(model).state is NodeState.TUNED
    assert claim.exists() and tuning_claim.read(claim).pid == 1  # another process's claim is never removed


def test_a_re_tune_another_process_claimed_waits_and_then_runs(monkeypatch):
    monkeypatch.setattr(replica_claims, "POLL_S", 0.05)
    _settings()
    jit_config.blocking = False
    jit_config.range_headroom = False
    jit_config.retune_after_misses = 2
    enable()
    model = make_mlp()
    _serve(model)
    node = PatchedModule.of(model)
    assert node.state is NodeState.TUNED
    real_take = tuning_claim.take

    def claimed_elsewhere(folder, key, lifetime_s):  # the wider graph's claim: another replica was first
        _claim_as_another_process(key)
        monkeypatch.setattr(tuning_claim, "take", real_take)
        return real_take(folder, key, lifetime_s)

    monkeypatch.setattr(tuning_claim, "take", claimed_elsewhere)
    _serve(model, [8, 9, 8])
    assert any("graph 0: process 1 on this host" in h for h in PatchedModule.history)
    assert sum(h.startswith("Tuning MLP") for h in PatchedModule.history) == 1
    for claim in DecisionStore(jit_config.cache_dir).folder.glob("*.claim"):
        claim.unlink()  # the other process ends without storing a decision
    time.sleep(0.1)
    _serve(model, [8, 9])
    assert sum(h.startswith("Tuning MLP") for h in PatchedModule.history) == 2
    assert node.state is NodeState.TUNED


def test_ranges_that_grew_while_waiting_still_reuse_the_decision_of_the_graph_waited_for(waiting_replica):
    """A batch of 16 recorded while waiting widens the graph (a new key): the other process's decision is for the
    graph as it was, and that one is reused; the batch-16 calls are then ordinary misses."""
    model, _key, stored, claim = waiting_replica
    _serve(model, [16, 2])  # recorded while still waiting: the graph's ranges now reach 16
    time.sleep(0.1)
    _serve(model, [2, 16])  # a look while the graph waited for is still claimed: the wider one is not tuned here
    assert CountingBackend.builds == 0 and PatchedModule.of(model).state is NodeState.RECORDING
    shutil.copy(stored, DecisionStore(jit_config.cache_dir).folder / stored.name)
    claim.unlink()
    time.sleep(0.1)
    _serve(model, [2, 3])
    node = PatchedModule.of(model)
    assert node.state is NodeState.TUNED and CountingBackend.builds == 1
    assert any("reused the decision of MLP from the cache" in h for h in PatchedModule.history), "\n".join(
        h for h in PatchedModule.history if "child module" not in h)
    assert not any(h.startswith("Tuning MLP") for h in PatchedModule.history)
    assert node.waited_specs == {}
    _serve(model, [16])
    assert node.fallbacks == 1  # outside the reused graph's ranges: eager, counted towards a re-tune


def test_another_graph_failing_while_one_waits_does_not_send_the_node_eager(waiting_replica, monkeypatch):
    """Graph 0 waits for the other process; graph 1 (3-d inputs) fails to build here: the node keeps waiting for
    graph 0 (it would otherwise go eager for good and never reuse the decision it waits for)."""
    model, _key, stored, claim = waiting_replica
    real_build = CountingBackend._build

    def refuses_three_dims(self, module, graph_spec, data, cache_dir):  # (the same backend: the same keys)
        if len(graph_spec.input_spec.tensors[0].min_shape) == 3:
            raise RuntimeError("refuses 3-d inputs")
        return real_build(self, module, graph_spec, data, cache_dir)

    monkeypatch.setattr(CountingBackend, "_build", refuses_three_dims)
    with bypassed():
        reference = make_mlp()
        inputs = [torch.randn(batch, 4, 32) for batch in (2, 3, 2, 3)]
        expected = [reference(x) for x in inputs]
    with torch.no_grad():
        outputs = [model(x) for x in inputs]
    assert wait_until_tuned(timeout=30)
    for out, ref in zip(outputs, expected):
        torch.testing.assert_close(out, ref)
    node = PatchedModule.of(model)
    assert node.state is NodeState.RECORDING, node.reason
    assert any("refuses 3-d inputs" in h for h in PatchedModule.history)  # (graph 1 was tried, and failed)
    shutil.copy(stored, DecisionStore(jit_config.cache_dir).folder / stored.name)
    claim.unlink()
    time.sleep(0.1)
    _serve(model)
    assert node.state is NodeState.TUNED and [spec.name for spec, _b in node._entries] == ["0"]


def test_an_abandoned_job_lets_go_of_its_claims_and_an_eager_node_waits_for_nothing(monkeypatch):
    """The worker abandons a job past `tuning_timeout_s` (`give_up`): its claims go at once, not when its thread
    ends; and a node that went eager is not listed as waiting at exit."""
    _settings()
    jit_config.blocking = False
    jit_config.tuning_timeout_s = 0.3
    CountingBackend.build_delay_s = 2.0
    enable()
    model = make_mlp()
    run(model, [2, 3])
    deadline = time.monotonic() + 10
    while PatchedModule.of(model).state is not NodeState.EAGER and time.monotonic() < deadline:
        time.sleep(0.02)
    node = PatchedModule.of(model)
    assert node.state is NodeState.EAGER and "tuning_timeout_s" in str(node.reason)
    assert not list(DecisionStore(jit_config.cache_dir).folder.glob("*.claim"))  # the build still sleeps
    node._waits["0"] = time.monotonic() + 60  # (as if it had waited before)
    node._drop_forward()
    assert not node.waiting_on_others
    wait_until_tuned(timeout=10)


def test_prefork_workers_tune_once_and_the_others_reuse(tmp_path):
    """gunicorn `--preload`: the parent builds the model (one warm-up call) and forks three workers sharing a
    cache folder; one worker tunes, the others wait for it and reuse its decision; every answer is eager's."""
    script = Path(__file__).parent / "scripts" / "prefork_server.py"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "cache"), "3"], capture_output=True,
                          text=True, timeout=120, env=env)
    reports = [json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines()
               if line.startswith("WORKER-REPORT ")]
    assert len(reports) == 3, done.stdout + done.stderr[-3000:]
    assert all(r["state"] == "TUNED" and r["wrong"] == 0 for r in reports), reports
    tuned = [r for r in reports if any(h.startswith("Tuning MLP") for h in r["history"])]
    assert len(tuned) == 1, reports
    waited = [r for r in reports if r not in tuned]
    assert all(any("is tuning it" in h for h in r["history"]) and any("reused the decision" in h for h in r["history"])
               for r in waited), reports
