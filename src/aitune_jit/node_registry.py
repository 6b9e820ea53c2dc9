"""`registry`: the live JIT nodes (the roots of the observed call trees) and the tuning history.

Why a file of its own: the node (`patched_module.py`), the views and the exit summary (`summary.py`) all read the
call tree and the history. The registry knows a node only through the small `TreeNode` protocol below, so the
files below the node never name its class (no import circle between the node and what it uses).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from aitune_jit.state import NodeState

_logger = logging.getLogger("aitune.jit")

#: entries of the history kept (the oldest go first)
HISTORY_LIMIT = 10_000


class TreeNode(Protocol):
    """What the registry, the thread's call stack and the exit summary read of a node (`PatchedModule`)."""

    path: str
    level: int
    state: NodeState
    reason: str | None
    children: list[TreeNode]

    @property
    def short(self) -> str: ...

    @property
    def fallbacks(self) -> int: ...

    @property
    def missed_code(self) -> int: ...


class NodeRegistry:
    """The roots of the call trees (weakly: a dead module's node goes with it), how many nodes were ever made, and
    the bounded history of every step JIT tuning took. `lock` also orders the nodes' first steps (`_start`)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        #: every step JIT tuning took, in order (bounded to the last `HISTORY_LIMIT` entries; cleared in place)
        self.history: list[str] = []
        self.nodes_seen = 0
        self.root_refs: list[weakref.ref[TreeNode]] = []

    def add(self, node: TreeNode, parent: TreeNode | None) -> None:
        """Count a new node; a root is kept (and the roots whose module died are dropped now: a module built per
        call at top level makes a root per call)."""
        with self.lock:
            self.nodes_seen += 1
            if parent is None:
                refs = [ref for ref in self.root_refs if ref() is not None]
                refs.append(weakref.ref(node))
                self.root_refs = refs

    def roots(self) -> list[TreeNode]:
        with self.lock:
            alive = [node for node in (ref() for ref in self.root_refs) if node is not None]
            self.root_refs = [weakref.ref(node) for node in alive]
        return alive

    def walk(self) -> Iterator[TreeNode]:
        """Every live node, depth first, parents before children."""
        for root in self.roots():
            yield from subtree(root)

    def forget_roots(self) -> None:
        with self.lock:
            self.root_refs = []

    def log(self, message: str, level: int = logging.INFO) -> None:
        """Append to the history and log it (`aitune.jit`)."""
        with self.lock:
            self.history.append(message)
            if len(self.history) > HISTORY_LIMIT:
                del self.history[: len(self.history) - HISTORY_LIMIT]
        _logger.log(level, message)

    def clear_history(self) -> None:
        with self.lock:
            self.history.clear()

    def hierarchy_lines(self) -> list[str]:
        """The observed call tree, one line per node (`str(node)`), indented by level."""
        return ["JIT Tuning Hierarchy:", *(f"{'   ' * node.level}├─ {node}" for node in self.walk())]


def subtree(node: TreeNode) -> Iterator[TreeNode]:
    """`node` and every node below it, depth first, parents before children."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


registry = NodeRegistry()
