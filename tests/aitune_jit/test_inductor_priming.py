"""inductor_priming: Inductor's identity graph module is made without FX's symbolic trace."""

from __future__ import annotations

import torch

from aitune_jit import inductor_priming


def test_inductor_s_one_symbolic_trace_is_primed_without_patching_module_call(monkeypatch):
    """torch.fx.symbolic_trace patches nn.Module.__call__ process-wide while it runs: a request served on the main
    thread meanwhile would fail. The worker fills Inductor's cached identity graph module without tracing."""
    from torch._inductor.loop_body import InterpreterShim

    traced = []
    monkeypatch.setattr(torch.fx, "symbolic_trace", lambda fn: traced.append(fn))
    monkeypatch.setattr(inductor_priming, "_primed", False)
    InterpreterShim._dummy_gm.cache_clear()
    try:
        inductor_priming.prime_inductor_without_fx_patching()
        gm = InterpreterShim._dummy_gm()
        assert traced == [] and isinstance(gm, torch.fx.GraphModule) and gm(7) == 7
        assert torch.fx.symbolic_trace is not inductor_priming._identity_graph_module  # put back
    finally:
        InterpreterShim._dummy_gm.cache_clear()
