"""`NodeViews`: how a JIT node and the call tree present themselves (a mixin of `PatchedModule`).

A node's one-line description (`str(node)`: parameters, level, state, backends, calls, eager fallbacks), its
backends and measured speed-up; `PatchedModule.print_hierarchy()` draws the observed call tree with those lines,
and `PatchedModule.print_history()` prints every step tuning took. Both read the live nodes through
`PatchedModule.walk()` and the bounded `history`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aitune_jit.node_registry import registry
from aitune_jit.state import NodeState

if TYPE_CHECKING:
    from aitune_core.backends.backend import Backend
    from aitune_core.backends.dispatcher import GraphDispatcher
    from aitune_core.recording.graph_recorder import GraphRecorder


def format_count(count: int) -> str:
    """Parameter counts as in the hierarchy view: 128, 9.4K, 11.7M, 1.2B."""
    if count < 1000:
        return str(count)
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f}{unit}"
    return str(count)  # pragma: no cover


class NodeViews:
    """Views of `PatchedModule`'s tree and history (public through `aitune.torch.PatchedModule`)."""

    __slots__ = ()

    @property
    def short(self) -> str:
        return f"{self.name} 📊{format_count(self.num_parameters)}"

    @property
    def backends(self) -> list[Backend]:
        return [backend for _spec, backend in self._entries]

    @property
    def backend_names(self) -> list[str]:
        names: list[str] = []
        for backend in self.backends:
            if backend.name not in names:
                names.append(backend.name)
        return names

    @property
    def speedup(self) -> float | None:
        """Eager / tuned latency measured at recorded shapes (first graph that was measured), else None."""
        for report in self.reports:
            if report.speedup is not None:
                return report.speedup
        return None

    @property
    def dispatcher(self) -> GraphDispatcher | None:
        return self._dispatcher

    @property
    def recorder(self) -> GraphRecorder | None:
        return self._recorder

    def __str__(self) -> str:
        backend = f" ({', '.join(self.backend_names)})" if self.state is NodeState.TUNED and self._entries else ""
        eager = f" eager_fallbacks={self._growth.total}" if self._growth.total else ""
        return (
            f"{self.short} level={self.level}🪜 state={self.state}{backend} call_count={self.call_count}{eager}"
        )

    @property
    def fallbacks(self) -> int:
        """Calls of tuned graphs that ran eagerly because their shapes were outside the tuned ranges."""
        return self._growth.total

    @property
    def missed_code(self) -> int:
        """Calls of tuned graphs that missed the compiled code (a changed attribute, global, config value or grad
        mode failed dynamo's guards) and ran the original forward."""
        return self._growth.code_total

    def __repr__(self) -> str:
        return f"<PatchedModule {self.path} {self.state.name}>"

    @classmethod
    def hierarchy_lines(cls) -> list[str]:
        return registry.hierarchy_lines()

    @classmethod
    def print_hierarchy(cls, sink: Callable[[str], Any] = print) -> None:
        """Print the observed call tree: one line per node with parameters, level, state, backend, calls."""
        for line in cls.hierarchy_lines():
            sink(line)

    @classmethod
    def print_history(cls, sink: Callable[[str], Any] = print) -> None:
        """Print every step JIT tuning took (new modules, graph-break checks, tuning, failures, detaching)."""
        for line in list(cls.history):
            sink(line)
