"""The registry of live JIT nodes: roots kept weakly, the tree walked parents first, the history bounded."""

from __future__ import annotations

import gc
import logging

from aitune_jit import node_registry
from aitune_jit.node_registry import NodeRegistry, subtree
from aitune_jit.state import NodeState


class _Node:
    def __init__(self, path: str, level: int = 0) -> None:
        self.path = path
        self.level = level
        self.state = NodeState.INIT
        self.reason = None
        self.children: list[_Node] = []
        self.short = path
        self.fallbacks = 0

    def __str__(self) -> str:
        return self.path


def _tree() -> _Node:
    root = _Node("root")
    a, b = _Node("root.a", 1), _Node("root.b", 1)
    a.children.append(_Node("root.a.x", 2))
    root.children.extend([a, b])
    return root


def test_walk_visits_parents_before_children_in_call_order():
    registry = NodeRegistry()
    root = _tree()
    registry.add(root, None)
    for child in root.children:
        registry.add(child, root)
    assert [n.path for n in registry.walk()] == ["root", "root.a", "root.a.x", "root.b"]
    assert [n.path for n in subtree(root.children[0])] == ["root.a", "root.a.x"]
    assert registry.nodes_seen == 3  # every node counts, only roots are kept
    assert registry.hierarchy_lines() == [
        "JIT Tuning Hierarchy:", "├─ root", "   ├─ root.a", "      ├─ root.a.x", "   ├─ root.b"
    ]


def test_roots_are_held_weakly_and_dead_ones_dropped_on_add():
    registry = NodeRegistry()
    for i in range(5):
        registry.add(_Node(f"gone{i}"), None)  # nothing else holds these
    gc.collect()
    kept = _Node("kept")
    registry.add(kept, None)
    assert len(registry.root_refs) == 1
    assert registry.roots() == [kept]
    registry.forget_roots()
    assert registry.roots() == []


def test_history_is_bounded_cleared_in_place_and_logged(monkeypatch, caplog):
    monkeypatch.setattr(node_registry, "HISTORY_LIMIT", 3)
    registry = NodeRegistry()
    history = registry.history
    with caplog.at_level(logging.INFO, logger="aitune.jit"):
        for i in range(5):
            registry.log(f"step {i}")
    assert history == ["step 2", "step 3", "step 4"]
    assert [r.getMessage() for r in caplog.records] == [f"step {i}" for i in range(5)]
    registry.clear_history()
    assert registry.history is history and history == []
