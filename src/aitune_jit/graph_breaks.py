"""Graph-break detection: dynamo's explanation of one recorded call.

This is `torch._dynamo.explain` without its two global `torch._dynamo.reset()` calls: explain throws away
every compiled function in the process (the user's own `torch.compile` results and the modules JIT tuning
already compiled), which a hook running inside a live program must not do. The same machinery is used
through its public door, `torch.compile(fn, backend=ExplainWithBackend("eager"))`, on a probe function
with a code object of its own, so dynamo's cache entries for the check go away with the probe.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from aitune_core.backends.isolated_entry import isolated_entry
from aitune_core.errors import brief

_TORCH_DIR = os.path.dirname(torch.__file__)
_SRC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SKIPPED_DIRS = (
    *(os.path.join(_SRC_DIR, package) + os.sep for package in ("aitune", "aitune_aot", "aitune_core", "aitune_jit")),
    _TORCH_DIR + os.sep,
)


@dataclasses.dataclass
class GraphBreakReport:
    """What dynamo found when it traced one call."""

    graph_count: int
    reasons: list[str]  # one line per break: the reason and the user's source line
    duration_s: float
    error: str | None = None  # dynamo could not trace the call at all

    @property
    def break_count(self) -> int:
        return len(self.reasons)

    @property
    def has_breaks(self) -> bool:
        return bool(self.reasons) or self.graph_count > 1 or self.error is not None

    def summary(self) -> str:
        if self.error is not None:
            return f"dynamo could not trace it: {self.error}"
        if not self.reasons:
            return f"{self.graph_count} graphs"
        return f"{self.break_count} graph break(s): " + " | ".join(self.reasons)


def _user_frame(user_stack: list[Any]) -> Any:
    """The innermost frame of the user's code (not torch's, not aitune's)."""
    for frame in reversed(user_stack or []):
        filename = os.path.abspath(getattr(frame, "filename", "") or "")
        if not filename.startswith(_SKIPPED_DIRS):
            return frame
    return user_stack[-1] if user_stack else None


def describe_reason(reason: Any) -> str:
    """`<dynamo's reason> at <file>:<line> in <function>: <source line>`."""
    text = " ".join(str(getattr(reason, "reason", reason)).split())
    if len(text) > 300:
        text = text[:297] + "..."
    frame = _user_frame(getattr(reason, "user_stack", []))
    if frame is None:
        return text
    line = (getattr(frame, "line", "") or "").strip()
    where = f"{frame.filename}:{frame.lineno} in {frame.name}"
    return f"{text} at {where}" + (f": `{line}`" if line else "")


def find_graph_breaks(fn: Callable[..., Any], args: tuple, kwargs: dict) -> GraphBreakReport:
    """Trace `fn(*args, **kwargs)` with dynamo (no code generation) and report the graph breaks."""
    from torch._dynamo.backends.debugging import ExplainWithBackend

    explainer = ExplainWithBackend("eager")
    probe = isolated_entry(fn, "aitune_graph_break_probe")  # dynamo's cache for it dies with the probe
    start = time.perf_counter()
    try:
        compiled = torch.compile(probe, backend=explainer, dynamic=False, fullgraph=False)
        with torch.no_grad():
            compiled(*args, **kwargs)
        output = explainer.output()
    except Exception as exc:
        # (dynamo's explanation and the user's stack run to a page: the summary line got all of it)
        return GraphBreakReport(0, [], time.perf_counter() - start, error=brief(exc))
    reasons = [describe_reason(reason) for reason in output.break_reasons]
    return GraphBreakReport(output.graph_count, reasons, time.perf_counter() - start)
