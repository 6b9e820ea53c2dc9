"""Inductor's one symbolic trace, done without patching `torch.nn.Module.__call__` (before the worker's first job).

Inductor's code generation builds, once per process, `torch.fx.symbolic_trace(identity)`
(`torch._inductor.loop_body.InterpreterShim._dummy_gm`). A symbolic trace replaces `torch.nn.Module.__call__`
process-wide while it runs, so a module call made meanwhile by another thread - the application serving requests
while the worker compiles - goes through FX's tracer and fails ("module is not installed as a submodule"). The
worker fills that cache first with an equal graph module built without tracing.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

_logger = logging.getLogger("aitune.jit")


def _identity_graph_module(fn: Any) -> torch.fx.GraphModule:
    """What `torch.fx.symbolic_trace(identity)` returns, built with the Graph API (no tracer, no patching)."""
    graph = torch.fx.Graph()
    graph.output(graph.placeholder("x"))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


_primed = False


def prime_inductor_without_fx_patching() -> None:
    """Fill Inductor's cached identity graph module with one built without tracing (see the module docstring);
    once per process, tried again by the next job if this torch has no such cache."""
    global _primed
    if _primed:
        return
    try:
        from torch._inductor.loop_body import InterpreterShim

        saved = torch.fx.symbolic_trace
        torch.fx.symbolic_trace = _identity_graph_module  # type: ignore[assignment]
        try:
            InterpreterShim._dummy_gm()
        finally:
            torch.fx.symbolic_trace = saved
        _primed = True
    except Exception:  # another torch: nothing to prime (tried again by the next job)
        _logger.debug("could not prime Inductor's identity graph module", exc_info=True)
