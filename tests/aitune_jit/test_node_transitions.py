"""`NodeTransitions`: the tuner only reads a node; the node applies the outcome, one handler per verdict."""

from __future__ import annotations

import jit_helpers
import pytest
from jit_helpers import CountingBackend, run, states

from aitune_jit import tuner
from aitune_jit.config import jit_config
from aitune_jit.outcome import TuningOutcome, Verdict
from aitune_jit.patched_module import PatchedModule
from aitune_jit.state import NodeState


@pytest.fixture
def recording():
    """An MLP whose root records (2 calls, 5 needed): its children are seen but wait (INIT)."""
    return jit_helpers.recording_mlp()


def test_tuning_returns_an_outcome_and_changes_the_node_only_when_applied(recording):
    model, node = recording
    jit_config.min_samples = 2
    assert [spec.name for spec in node.ready_graphs()] == ["0"]
    outcome = tuner.tune(node)
    assert outcome.verdict is Verdict.TUNED and len(outcome.entries) == 1
    assert node.state is NodeState.RECORDING and node.dispatcher is None  # nothing changed yet
    node.apply(outcome)
    assert node.state is NodeState.TUNED and node.dispatcher is not None and node.fast
    assert set(states(model).values()) == {"tuned", "detached"}
    infers = CountingBackend.infers
    run(model, [2])
    assert CountingBackend.infers == infers + 1
    assert node.ready_graphs() == []  # the tuned graph is done


def test_descend_sends_the_node_eager_and_its_children_become_candidates(recording):
    model, node = recording
    node.apply(TuningOutcome.eager("graph break: x", reopen=True))
    assert node.state is NodeState.EAGER and node.reason == "graph break: x" and node.descend
    assert "forward" not in model.__dict__ and node.recorder is None  # the one clean-up ran
    assert {child.state for child in node.children} == {NodeState.RECORDING}
    assert "MLP 📊2.4K stays eager: graph break: x" in PatchedModule.history


def test_eager_with_children_closed_puts_the_waiting_children_on_the_fast_path(recording):
    _model, node = recording
    node.apply(TuningOutcome.eager("too cheap", reopen=False))
    assert node.state is NodeState.EAGER and not node.descend
    assert {child.state for child in node.children} == {NodeState.DETACHED}  # never candidates: not waiting
    assert all(child.fast for child in node.children)


def test_dry_run_leaves_the_module_as_it_is_and_covers_the_subtree(recording):
    model, node = recording
    node.apply(TuningOutcome.dry_run("would tune MLP"))
    assert node.state is NodeState.SKIPPED and node.fast and node.reason == "dry run: would tune MLP"
    assert "forward" not in model.__dict__
    assert {child.state for child in node.children} == {NodeState.DETACHED}


def test_unchanged_notes_failed_graphs_retunes_and_checks(recording):
    _model, node = recording
    jit_config.min_samples = 2
    node._growth.due.add("0")
    node.apply(TuningOutcome.unchanged(failed={"0": "boom"}, retuned=frozenset({"0"}), checked=frozenset({"0"})))
    assert node.state is NodeState.RECORDING
    assert node.ready_graphs() == [] and node.checked_graphs == {"0"}
    assert node.retune_due == frozenset() and node._growth.retunes == {"0": 1}


def test_a_dropped_job_lets_the_node_record_again(recording):
    _model, node = recording
    node._tuning = True
    node.job_dropped()
    assert not node._tuning
