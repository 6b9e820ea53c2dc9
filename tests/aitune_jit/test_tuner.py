"""`aitune_jit.tuner`: where the graph-break check runs - inside the first compile when every candidate traces
the module as one graph, before tuning otherwise."""

from __future__ import annotations

import torch
from jit_helpers import (
    CountingBackend,
    DynamicModule,
    WholeGraphBackend,
    WholeGraphWrongValuesBackend,
    enable_and_run_mlp,
    enable_and_serve_both_branches,
    make_mlp,
    run,
    states,
)

from aitune_core.backends import defaults as backend_defaults
from aitune_jit import tuner
from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.state import NodeState
from aitune_jit.switch import enable


def _setup(*backends: object) -> None:
    jit_config.backends = list(backends)
    jit_config.min_parameters = 0
    jit_config.detect_graph_breaks = True


def _history(prefix: str) -> list[str]:
    return [h for h in PatchedModule.history if h.startswith(prefix)]


def test_a_whole_graph_build_is_the_check():
    _setup(WholeGraphBackend())
    model = enable_and_run_mlp([2, 3, 4])
    assert PatchedModule.of(model).state is NodeState.TUNED
    assert _history("No graph breaks in MLP 📊2.4K: its compile traced graph 0 as one graph")
    assert not [h for h in PatchedModule.history if "Checking took" in h]  # no separate dynamo trace
    assert CountingBackend.builds == 1


def test_a_graph_break_fails_the_build_and_is_explained_once():
    _setup(WholeGraphBackend())
    model = DynamicModule().eval()
    enable_and_serve_both_branches(model)
    root = PatchedModule.of(model)
    assert root.state is NodeState.EAGER and root.reason.startswith("graph break")
    assert states(model) == {"DynamicModule": "eager", "DynamicModule.child_a": "tuned",
                             "DynamicModule.child_b": "tuned"}
    breaks = _history("Graph breaks in DynamicModule")
    assert len(breaks) == 1 and "if x.sum() > 0:" in breaks[0]
    assert CountingBackend.builds == 3  # the root's failed build, then child_a and child_b


def test_a_build_that_fails_later_is_not_explained():
    """The candidate traced the module as one graph and then failed validation: no break to look for."""
    _setup(WholeGraphWrongValuesBackend())
    model = make_mlp()
    enable()
    run(model, [2, 3])
    root = PatchedModule.of(model)
    assert root.state is NodeState.EAGER and "graph break" not in (root.reason or "")
    assert not [h for h in PatchedModule.history if "Checking took" in h]
    assert _history("No graph breaks in MLP 📊2.4K: its compile traced graph 0 as one graph")


def test_other_candidates_keep_the_check_before_tuning():
    _setup(WholeGraphBackend(), CountingBackend())
    model = make_mlp()
    enable()
    run(model, [2, 3])
    assert PatchedModule.of(model).state is NodeState.TUNED
    assert _history("No graph breaks in MLP 📊2.4K. Checking took ")


def test_compile_finds_breaks_needs_every_candidate():
    class Strategy:
        def __init__(self, backends: list) -> None:
            self.backends = backends

    assert tuner._compile_finds_breaks(Strategy([WholeGraphBackend(), WholeGraphBackend()]))
    assert not tuner._compile_finds_breaks(Strategy([WholeGraphBackend(), CountingBackend()]))
    assert not tuner._compile_finds_breaks(Strategy([]))
    assert not tuner._compile_finds_breaks(object())  # a custom strategy without `backends`


def test_the_default_strategy_compiles_whole_graphs_while_breaks_are_detected(monkeypatch):
    monkeypatch.setattr(backend_defaults, "tensorrt_available", lambda: False)
    jit_config.detect_graph_breaks = True
    strategy = jit_config.resolve_strategy(torch.device("cpu"))
    assert strategy.backends and all(b.traces_whole_graph for b in strategy.backends)
    assert tuner._compile_finds_breaks(strategy)
    jit_config.detect_graph_breaks = False
    strategy = jit_config.resolve_strategy(torch.device("cpu"))
    assert not any(b.traces_whole_graph for b in strategy.backends)


class _Kept:
    def __init__(self, keys: torch.Tensor) -> None:
        self.keys = keys


class _ReturnsACache(torch.nn.Module):
    """A forward that returns a new object holding tensors, as a causal LM called with `use_cache` on returns a
    DynamicCache."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(32, 32)
        self.b = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> dict[str, object]:
        h = self.a(x)
        return {"out": self.b(torch.relu(h)), "cache": _Kept(h)}


def test_a_module_that_returns_a_new_object_holding_tensors_is_tuned_and_compared_by_its_state():
    _setup(WholeGraphBackend())
    torch.manual_seed(0)
    model, twin = _ReturnsACache().eval(), _ReturnsACache().eval()
    twin.load_state_dict(model.state_dict())
    inputs = [torch.randn(batch, 32, generator=torch.Generator().manual_seed(batch)) for batch in (2, 3, 4, 2, 3)]
    with torch.no_grad():
        want = [twin(x) for x in inputs]
        enable()
        got = [model(x) for x in inputs]
    assert PatchedModule.of(model).state is NodeState.TUNED, PatchedModule.of(model).reason
    for g, w in zip(got, want):
        torch.testing.assert_close(g["out"], w["out"])
        torch.testing.assert_close(g["cache"].keys, w["cache"].keys)


def test_the_forward_only_view_is_not_seen_by_the_programs_registration_hooks():
    # a program that tracks module construction with torch's global registration hooks saw aitune's own wrapper
    # register the user's module (a helper's script, sixth round)
    from torch.nn.modules import module as torch_module

    seen = []
    handle = torch_module.register_module_module_registration_hook(lambda parent, name, sub: seen.append(name))
    try:
        model = torch.nn.Linear(2, 2)
        view = tuner.ForwardOnly(model, model.forward)
    finally:
        handle.remove()
    assert seen == [] and view.module is model and list(view.parameters()) == list(model.parameters())
