"""NodeViews: a node's one-line description and the class-level views of the tree."""

from __future__ import annotations

import torch
from jit_helpers import CountingBackend, make_mlp

from aitune_jit.config import jit_config
from aitune_jit.node_views import format_count
from aitune_jit.patched_module import PatchedModule
from aitune_jit.switch import enable


def test_parameter_counts_read_like_the_hierarchy():
    assert [format_count(n) for n in (999, 1_000, 25_600_000)] == ["999", "1.0K", "25.6M"]


def test_a_tuned_node_describes_its_backend_speed_and_fallbacks():
    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False
    jit_config.retune_after_misses = 0
    model = make_mlp()
    enable()
    with torch.no_grad():
        for batch in (2, 3, 9):  # tuned over 2..3; 9 runs eagerly
            model(torch.randn(batch, 32))
    node = PatchedModule.of(model)
    assert node.backend_names == ["CountingBackend"] and node.speedup is None  # FirstWins measures nothing
    assert str(node).endswith("state=tuned🎯 (CountingBackend) call_count=2 eager_fallbacks=1")
    lines: list[str] = []
    PatchedModule.print_hierarchy(sink=lines.append)
    assert lines[0] == "JIT Tuning Hierarchy:" and lines[1] == f"├─ {node}"
