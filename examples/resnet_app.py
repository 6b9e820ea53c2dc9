"""A plain PyTorch inference service, with nothing about aitune in it (the JIT demo runs it unmodified).

    python examples/resnet_app.py --out results.pt

Builds a small ResNet (random weights, no download), answers a stream of image-classification requests
at varying batch sizes, and reports its steady-state latency. Outputs of the measured requests are saved,
so two runs (with and without JIT tuning) can be compared.
"""

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Iterator

import torch
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
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


class ResNet(nn.Module):
    """ResNet-10-ish: stem, four stages of one BasicBlock each (16-32-64-128 channels), pool, classifier."""

    def __init__(self, num_classes: int = 100, widths: tuple[int, ...] = (16, 32, 64, 128)) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        layers, cin = [], widths[0]
        for i, width in enumerate(widths):
            layers.append(BasicBlock(cin, width, stride=1 if i == 0 else 2))
            cin = width
        self.layers = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layers(x)
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build_model() -> ResNet:
    torch.manual_seed(0)
    model = ResNet()
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):  # trained-looking statistics
            module.running_mean.uniform_(-0.2, 0.2)
            module.running_var.uniform_(0.5, 1.5)
    return model.eval()


def _lockstep_chunks(requests: int) -> Iterator[int]:
    """Chunk sizes a driver asks for on stdin: `GO <n>` serves the next n requests and answers `DONE`."""
    print("READY", flush=True)
    left = requests
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] != "GO":
            break
        size = min(int(words[1]), left) if len(words) > 1 else left
        yield size
        left -= size
        print("DONE", flush=True)
        if left <= 0:
            break


def serve(model: nn.Module, out: str, requests: int = 100, batch: int = 4, device: str = "cpu",
          lockstep: bool = False) -> None:
    """Answer the day's requests: a few at batch sizes 2 and 8, then `requests` measured ones at `batch`.

    With `lockstep`, the measured requests are served in chunks a driver asks for on stdin (`GO <n>`, answered
    by `DONE` on stdout), so that a driver can alternate two processes and both see the same machine load.
    """
    device_ = torch.device(device)
    generator = torch.Generator().manual_seed(1)
    image = lambda size: torch.randn(size, 3, 64, 64, generator=generator).to(device_)  # noqa: E731
    sync = torch.cuda.synchronize if device_.type == "cuda" else (lambda: None)

    with torch.inference_mode():
        for size in (2, 8, 2, 8):  # the first requests of the day
            model(image(size))
        measured = [image(batch) for _ in range(requests)]
        for x in measured[:5]:  # warm caches
            model(x)
        latencies, outputs = [], []
        chunks = _lockstep_chunks(requests) if lockstep else [requests]
        pending = iter(measured)
        for size in chunks:
            for x in itertools.islice(pending, size):
                sync()
                start = time.perf_counter()
                outputs.append(model(x))
                sync()
                latencies.append((time.perf_counter() - start) * 1000.0)
    measured = measured[: len(outputs)]
    torch.save(
        {
            "inputs": [x.cpu() for x in measured],
            "outputs": [y.cpu() for y in outputs],
            "latencies_ms": latencies,
            "device": torch.cuda.get_device_name(device_) if device_.type == "cuda" else "cpu",
        },
        out,
    )
    median = statistics.median(latencies) if latencies else float("nan")
    print(f"served {len(outputs)} requests at batch {batch}: median latency {median:.2f} ms", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description="A small ResNet answering image-classification requests")
    parser.add_argument("--out", required=True, help="where to save the outputs of the measured requests")
    parser.add_argument("--requests", type=int, default=100, help="measured requests")
    parser.add_argument("--batch", type=int, default=4, help="batch size of the measured requests")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--lockstep", action="store_true",
                        help="serve the measured requests in chunks asked for on stdin (`GO <n>` -> `DONE`)")
    options = parser.parse_args()
    model = build_model().to(options.device)
    serve(model, options.out, options.requests, options.batch, options.device, options.lockstep)


if __name__ == "__main__":
    main()
