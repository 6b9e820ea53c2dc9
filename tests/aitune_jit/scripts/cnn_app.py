"""A plain inference script with no aitune in it: a small ResNet-like CNN serving a few batches.

    python cnn_app.py OUT.pt

The JIT tests run it unmodified (env var, import line prepended, decorator around `build_model`).
"""

import sys

import torch
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layer1 = BasicBlock(16, 16)
        self.layer2 = BasicBlock(16, 32, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer2(self.layer1(self.stem(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


def build_model() -> SmallCNN:
    torch.manual_seed(0)
    model = SmallCNN()
    for module in model.modules():  # non-trivial BatchNorm statistics
        if isinstance(module, nn.BatchNorm2d):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 1.5)
    return model.eval()


def traffic() -> tuple[list[torch.Tensor], dict[int, torch.Tensor]]:
    """Requests at batch sizes 2 and 8, then at 3 and 5 (sizes the first requests never had)."""
    generator = torch.Generator().manual_seed(1)
    first = [torch.randn(batch, 3, 32, 32, generator=generator) for batch in (2, 8)]
    later = {batch: torch.randn(batch, 3, 32, 32, generator=generator) for batch in (3, 5)}
    return first, later


def serve(model: nn.Module, out_path: str) -> None:
    first, later = traffic()
    with torch.no_grad():
        for x in first:
            model(x)
        outputs = {batch: model(x) for batch, x in later.items()}
    torch.save(outputs, out_path)


if __name__ == "__main__":
    serve(build_model(), sys.argv[1])
