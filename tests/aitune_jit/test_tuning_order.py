"""The background worker tunes the queued node with the largest expected gain first (ties: queue order)."""

from __future__ import annotations

import threading

from aitune_jit.tuning_order import expected_gain, pick_next
from aitune_jit.worker import TuningWorker


class _Node:
    """What the worker reads of a node."""

    module = None

    def __init__(self, path: str, num_parameters: int) -> None:
        self.path = path
        self.num_parameters = num_parameters
        self._tuning = True


def test_the_largest_gain_is_picked_and_ties_keep_the_queue_order():
    assert pick_next([1.0, 5.0, 3.0, 5.0]) == 1
    assert pick_next([2.0, 2.0]) == 0
    assert pick_next([0.0]) == 0
    assert expected_gain(_Node("a", 1234)) == 1234.0
    assert expected_gain(object()) == 0.0


def test_children_queued_together_are_tuned_largest_first():
    """While one job runs, an embedding, two identical blocks and a head are queued: the blocks go first (the
    first of them before its sibling, which can then reuse its decision), the embedding and the head after."""
    release, order = threading.Event(), []

    def run(node: _Node) -> None:
        order.append(node.path)
        if node.path == "root":
            release.wait(10)

    worker = TuningWorker(run)
    nodes = [_Node("root", 10), _Node("embed", 6_000), _Node("blocks.0", 37_000), _Node("blocks.1", 37_000),
             _Node("head", 6_000), _Node("norm", 64)]
    try:
        worker.submit(nodes[0])
        while order != ["root"]:  # the first job runs; the others queue behind it
            threading.Event().wait(0.001)
        for node in nodes[1:]:
            worker.submit(node)
        release.set()
        assert worker.wait(10)
    finally:
        worker.stop(1.0)
    assert order == ["root", "blocks.0", "blocks.1", "embed", "head", "norm"]


def test_a_node_that_only_owes_packages_waits_for_every_node_that_tunes():
    node = _Node("packaging", 10_000_000)
    node.packaging_only = True
    assert expected_gain(node) == -1.0
    assert pick_next([expected_gain(node), expected_gain(_Node("tiny", 0))]) == 1
