"""hooks_hidden: a module's forward hooks set aside for a block, and put back with any added meanwhile."""

from __future__ import annotations

import torch

from aitune_aot.hooks_hidden import hooks_hidden


def test_hooks_do_not_fire_inside_and_come_back_with_new_ones():
    layer = torch.nn.Linear(2, 2)
    fired: list[str] = []
    layer.register_forward_hook(lambda m, a, o: fired.append("before"))
    with hooks_hidden(layer):
        layer(torch.ones(1, 2))
        layer.register_forward_hook(lambda m, a, o: fired.append("added"))
    assert fired == []
    layer(torch.ones(1, 2))
    assert fired == ["before", "added"]
