"""The hierarchy, its views, and every option that decides what gets tuned (acceptance 2 and 3)."""

from __future__ import annotations

import re

import pytest
import torch
from jit_helpers import CountingBackend, DynamicModule, enable_and_serve_both_branches, make_mlp, run, states

from aitune_jit.config import jit_config
from aitune_jit.node_registry import registry
from aitune_jit.patched_module import PatchedModule, format_count
from aitune_jit.state import NodeState
from aitune_jit.switch import enable


@pytest.fixture
def eager_backend():
    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False
    jit_config.min_parameters = 0


def test_format_count():
    assert [format_count(n) for n in (0, 128, 9_408, 513_000, 11_689_512, 1_200_000_000)] == [
        "0",
        "128",
        "9.4K",
        "513.0K",
        "11.7M",
        "1.2B",
    ]


def test_print_hierarchy_and_history_of_a_tuned_root(eager_backend):
    model = make_mlp()
    enable()
    run(model, [2, 3, 4, 5])
    lines: list[str] = []
    PatchedModule.print_hierarchy(sink=lines.append)
    assert lines[0] == "JIT Tuning Hierarchy:"
    # recorded 2..3, served 2..4 (range headroom): batch 4 is served, batch 5 runs eagerly, counted
    assert lines[1] == "├─ MLP 📊2.4K level=0🪜 state=tuned🎯 (CountingBackend) call_count=2 eager_fallbacks=1"
    assert lines[2] == "   ├─ Block 📊1.1K level=1🪜 state=detached☑️ call_count=2"
    assert lines[3] == "      ├─ Linear 📊1.1K level=2🪜 state=detached☑️ call_count=2"
    assert re.fullmatch(r"      ├─ ReLU 📊0 level=2🪜 state=detached☑️ call_count=2", lines[5])
    assert lines[-1] == "   ├─ Linear 📊132 level=1🪜 state=detached☑️ call_count=2"
    assert len(lines) == 1 + 1 + 2 * 4 + 1

    history = PatchedModule.history
    assert history[0] == "New top module: MLP 📊2.4K level=0🪜 state=init⏳ call_count=1"
    assert "New child module: Linear 📊1.1K level=2🪜 state=init⏳ call_count=1" in history
    assert any(re.fullmatch(r"Tuning MLP 📊2\.4K took \d+\.\d\ds: CountingBackend\(\) for graph 0", h) for h in history)
    unpatched = [h for h in history if h.startswith("Unpatching child module: ")]
    assert len(unpatched) == 9 and all("state=detached☑️" in h for h in unpatched)
    printed: list[str] = []
    PatchedModule.print_history(sink=printed.append)
    assert printed == history


def test_graph_break_makes_the_root_eager_and_its_children_tuned():
    """A DynamicModule (graph break on the input's values), both branches exercised."""
    jit_config.backends = [CountingBackend()]
    jit_config.min_parameters = 0
    jit_config.detect_graph_breaks = True
    torch.manual_seed(0)
    model = DynamicModule().eval()
    enable_and_serve_both_branches(model)
    root = PatchedModule.of(model)
    assert root.state is NodeState.EAGER
    assert root.reason.startswith("graph break")
    assert states(model) == {
        "DynamicModule": "eager",
        "DynamicModule.child_a": "tuned",
        "DynamicModule.child_b": "tuned",
    }
    breaks = [h for h in PatchedModule.history if h.startswith("Graph breaks in DynamicModule")]
    assert len(breaks) == 1
    # dynamo's reason, with the user's source line
    assert "test_jit_hierarchy.py" not in breaks[0]  # the model lives in jit_helpers.py
    assert "jit_helpers.py" in breaks[0] and "if x.sum() > 0:" in breaks[0]
    assert any(h.startswith("DynamicModule 📊440 stays eager: graph break") for h in PatchedModule.history)
    assert CountingBackend.builds == 2  # child_a and child_b, never the root


def test_detect_graph_breaks_off_tunes_the_root_anyway():
    jit_config.backends = [CountingBackend()]
    jit_config.min_parameters = 0
    jit_config.detect_graph_breaks = False
    model = DynamicModule().eval()
    enable()
    with torch.no_grad():
        for _ in range(2):
            model(torch.ones(2, 10))
    assert PatchedModule.of(model).state is NodeState.TUNED
    assert not any("graph break" in h.lower() for h in PatchedModule.history)


def test_no_graph_break_is_reported(eager_backend):
    jit_config.detect_graph_breaks = True
    model = make_mlp()
    enable()
    run(model, [2, 3])
    assert PatchedModule.of(model).state is NodeState.TUNED
    pattern = r"No graph breaks in MLP 📊2\.4K\. Checking took \d+\.\d\ds"
    assert any(re.fullmatch(pattern, h) for h in PatchedModule.history)


def test_skip_modules(eager_backend):
    jit_config.skip_modules = ["MLP", "LayerNorm"]
    model = make_mlp()
    enable()
    run(model, [2, 3, 4, 5, 6, 7])
    result = states(model)
    assert result["MLP"] == "skipped"
    assert result["MLP.blocks.0"] == "tuned" and result["MLP.head"] == "tuned"
    assert result["MLP.blocks.0.norm"] == "detached"
    assert "Skipping MLP 📊2.4K: MLP is in jit_config.skip_modules" in PatchedModule.history


def test_min_parameters(eager_backend):
    jit_config.min_parameters = 5000  # the root has 2.4K
    model = make_mlp()
    enable()
    run(model, [2, 3, 4, 5])
    assert set(states(model).values()) == {"skipped"}
    assert CountingBackend.builds == 0
    assert any("fewer than jit_config.min_parameters=5000" in h for h in PatchedModule.history)


def test_min_parameters_lets_big_children_through(eager_backend):
    jit_config.min_parameters = 1000
    jit_config.skip_modules = ["MLP"]
    model = make_mlp()
    enable()
    run(model, [2, 3, 4, 5])
    result = states(model)
    assert result["MLP.blocks.0"] == "tuned"  # 1.1K parameters
    assert result["MLP.head"] == "skipped"  # 132 parameters


def test_max_depth_level(eager_backend):
    jit_config.backends = [CountingBackend(), CountingBackend()]
    jit_config.skip_modules = ["MLP", "Block"]  # force the search downwards
    jit_config.max_depth_level = 1
    model = make_mlp()
    enable()
    run(model, [2, 3, 4, 5, 6])
    result = states(model)
    assert result["MLP.head"] == "tuned"  # level 1
    assert result["MLP.blocks.0.fc"] == "skipped"  # level 2 > max_depth_level
    assert any("deeper than jit_config.max_depth_level=1" in h for h in PatchedModule.history)
    jit_config.max_depth_level = 2
    model2 = make_mlp(seed=1)
    run(model2, [2, 3, 4])
    assert states(model2)["MLP.blocks.0.fc"] == "tuned"


@pytest.mark.parametrize("min_samples", [1, 3])
def test_min_samples(eager_backend, min_samples):
    jit_config.min_samples = min_samples
    model = make_mlp()
    enable()
    for call in range(1, min_samples + 1):
        run(model, [call + 1])
        expected = NodeState.TUNED if call == min_samples else NodeState.RECORDING
        assert PatchedModule.of(model).state is expected, call


def test_dry_run_changes_nothing(eager_backend):
    jit_config.dry_run = True
    jit_config.detect_graph_breaks = True
    model = make_mlp()
    reference = run(make_mlp(), [2, 3, 4, 5])
    enable()
    outputs = run(model, [2, 3, 4, 5])
    for out, ref in zip(outputs, reference):
        torch.testing.assert_close(out, ref)
    root = PatchedModule.of(model)
    assert root.state is NodeState.SKIPPED and root.reason.startswith("dry run: would tune MLP")
    assert CountingBackend.builds == 0 and CountingBackend.infers == 0
    assert "forward" not in model.__dict__
    assert any(h.startswith("Dry run: would tune MLP 📊2.4K (graphs 0) on cpu with FirstWinsStrategy") for h in
               PatchedModule.history)
    assert any(h.startswith("No graph breaks in MLP") for h in PatchedModule.history)  # the check still runs


def test_dry_run_reports_graph_breaks_and_descends():
    jit_config.backends = [CountingBackend()]
    jit_config.min_parameters = 0
    jit_config.dry_run = True
    model = DynamicModule().eval()
    enable()
    with torch.no_grad():
        for _ in range(3):
            model(torch.ones(2, 10))
            model(-torch.ones(2, 10))
    assert states(model) == {
        "DynamicModule": "eager",
        "DynamicModule.child_a": "skipped",
        "DynamicModule.child_b": "skipped",
    }
    assert CountingBackend.builds == 0


def test_training_mode_and_grad_are_not_recorded(eager_backend):
    model = make_mlp().train()
    enable()
    run(model, [2, 3, 4])
    assert PatchedModule.of(model).state is NodeState.RECORDING
    assert PatchedModule.of(model).recorder.total_calls == 0
    model.eval()
    x = torch.randn(2, 32)
    for _ in range(3):
        model(x)  # gradients enabled
    assert PatchedModule.of(model).recorder.total_calls == 0
    assert any("training mode" in h for h in PatchedModule.history)
    assert any("gradients enabled" in h for h in PatchedModule.history)
    run(model, [2, 3])
    assert PatchedModule.of(model).state is NodeState.TUNED
    # a tuned module called with gradients runs its original forward: backward still works
    out = model(torch.randn(2, 32, requires_grad=True)).sum()
    out.backward()
    assert model.head.weight.grad is not None


def test_batch_axis_required(eager_backend):
    jit_config.batch_axis_required = True
    model = make_mlp()
    enable()
    run(model, [4, 4, 4])  # one batch size only: no batch axis can be seen
    assert PatchedModule.of(model).state is NodeState.RECORDING
    assert any("no batch axis yet" in h for h in PatchedModule.history)
    run(model, [2])
    assert PatchedModule.of(model).state is NodeState.TUNED
    spec = PatchedModule.of(model).dispatcher.entries[0][0]
    assert spec.input_spec.tensors[0].batch_axes() == [0]


class _BuildsAModulePerCall(torch.nn.Module):
    """`nn.Softmax(dim=-1)(x)` inline in forward: a new module object on every call."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.Softmax(dim=-1)(self.fc(x))


def test_nodes_of_modules_that_died_are_not_kept():
    """An untuned node whose forward builds a module per call must not keep one child node per call forever
    (a leak in a long-running program)."""
    jit_config.skip_modules = ["_BuildsAModulePerCall"]  # the root stays SKIPPED, its children are seen
    model = _BuildsAModulePerCall().eval()
    enable()
    with torch.no_grad():
        for _ in range(50):
            model(torch.randn(2, 8))
    root = PatchedModule.of(model)
    assert root.state is NodeState.SKIPPED
    assert len(root.children) <= 3, [child.path for child in root.children]
    assert root.children[0].path == "_BuildsAModulePerCall.fc"


def test_roots_of_modules_that_died_are_not_kept():
    """A serving loop that post-processes with `nn.Softmax(dim=-1)(logits)` makes a new root per call: the
    registry of roots must not grow with every call."""
    enable()
    with torch.no_grad():
        for _ in range(50):
            torch.nn.Softmax(dim=-1)(torch.randn(2, 8))
    assert len(registry.root_refs) <= 3


def test_the_subtree_of_a_node_closed_for_tuning_reaches_the_fast_path(eager_backend):
    """A root that goes eager with its children closed (here: the tuning budget is spent) leaves children that
    will never be candidates: they, and then the root, settle on the hook's fast path instead of taking its
    slow path on every call."""
    from aitune_jit.tuning_budget import budget

    jit_config.tuning_budget_s = 0.0
    budget.reset()
    model = make_mlp(blocks=2)
    reference = run(make_mlp(blocks=2), [2, 3, 4, 5, 6, 7])
    enable()
    outputs = run(model, [2, 3, 4, 5, 6, 7])
    for out, ref in zip(outputs, reference):
        torch.testing.assert_close(out, ref)
    root = PatchedModule.of(model)
    assert root.state is NodeState.EAGER and not root.descend
    below = list(root.subtree())[1:]
    assert below and all(node.state is NodeState.DETACHED for node in below)
    assert all(node.fast for node in root.subtree())
    assert CountingBackend.builds == 0


def test_an_inductor_candidate_that_meets_a_graph_break_warns_nothing_mid_run(caplog):
    """Data-dependent control flow: the whole-graph Inductor candidate fails on it; that is the graph break the
    exit summary names, not a backend failure to WARN about while the program runs."""
    import logging

    from aitune_core.backends.torch_inductor import TorchInductorBackend, TorchInductorBackendConfig
    from aitune_jit.summary import summary_lines

    jit_config.backends = [TorchInductorBackend(TorchInductorBackendConfig(fullgraph=True))]
    jit_config.min_parameters = 0
    jit_config.detect_graph_breaks = True
    torch.manual_seed(0)
    model = DynamicModule().eval()
    with caplog.at_level(logging.WARNING, logger="aitune"):
        enable_and_serve_both_branches(model)
    assert PatchedModule.of(model).reason.startswith("graph break")
    assert not [r.getMessage() for r in caplog.records if "failed" in r.getMessage()], caplog.text
    assert any("stayed eager: graph break" in line for line in summary_lines())
