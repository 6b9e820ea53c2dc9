import torch
from torch import nn

from aitune_core.strategies.cost_model import single_torch_layer


class View(nn.Module):
    """Like the JIT's forward-only view: the layer is its only submodule, no weights of its own."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return torch.relu(self.layer(x))


class Scaled(View):
    def __init__(self, layer):
        super().__init__(layer)
        self.scale = nn.Parameter(torch.ones(1))


class OwnLeaf(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4, 4))

    def forward(self, x):
        return x @ self.weight


def test_torch_layers_and_thin_views_of_them_are_single_layers():
    assert single_torch_layer(nn.Linear(4, 4)) == "Linear"
    assert single_torch_layer(nn.Embedding(10, 4)) == "Embedding"
    assert single_torch_layer(nn.LayerNorm(4)) == "LayerNorm"
    assert single_torch_layer(View(nn.Conv2d(3, 3, 3))) == "Conv2d"


def test_modules_with_more_work_are_not():
    assert single_torch_layer(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))) is None
    assert single_torch_layer(View(View(nn.Linear(4, 4)))) is None  # two submodules
    assert single_torch_layer(Scaled(nn.Linear(4, 4))) is None  # weights of its own
    assert single_torch_layer(OwnLeaf()) is None  # a user's leaf: its forward is arbitrary code
    assert single_torch_layer(View(OwnLeaf())) is None
    assert single_torch_layer(lambda x: x) is None
