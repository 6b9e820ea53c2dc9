"""Small models and a recorder helper for the export / quantization backend tests (TorchAO, ONNX Runtime, TensorRT).

Importable from a subprocess with `PYTHONPATH=tests/aitune_core`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from aitune_core.context import BATCH_SIZE_KEY, global_context
from aitune_core.recording.graph_recorder import GraphRecorder


class MLP(torch.nn.Module):
    def __init__(self, features: int = 32, hidden: int = 64, out: int = 16) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(features, hidden)
        self.fc2 = torch.nn.Linear(hidden, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class TransformerBlock(torch.nn.Module):
    """Pre-norm self-attention + MLP block, written out by hand (q/k/v/out and MLP projections are nn.Linear)."""

    def __init__(self, dim: int = 64, heads: int = 4, hidden: int = 128) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.fc1 = torch.nn.Linear(dim, hidden)
        self.fc2 = torch.nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.reshape(batch, seq, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        bias = None if mask is None else (1.0 - mask[:, None, None, :].to(x.dtype)) * -1e4
        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm2(x))))


class SmallCNN(torch.nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.fc = torch.nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.conv1(x)))
        x = torch.relu(self.conv2(x))
        return self.fc(x.mean(dim=(2, 3)))


class ConvOnly(torch.nn.Module):
    """No nn.Linear: nothing for torchao's default filter to quantize."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class DictInTupleOut(torch.nn.Module):
    """Dict input (+ a keyword tensor and a non-tensor argument), tuple output with a nested dict."""

    def __init__(self) -> None:
        super().__init__()
        self.image = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.text = torch.nn.Embedding(50, 4)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, inputs: dict[str, torch.Tensor], *, bias: torch.Tensor, scale: float = 1.0):
        pooled = self.image(inputs["pixels"]).mean(dim=(2, 3))
        tokens = self.text(inputs["tokens"]).mean(dim=1)
        logits = self.head(torch.cat([pooled, tokens], dim=-1)) * scale + bias
        return logits, {"pooled": pooled, "tokens": tokens * 2}


def record(
    module: torch.nn.Module,
    make_call: Callable[[int], tuple[tuple[Any, ...], dict[str, Any]]],
    batch_sizes: Iterable[int] = (2, 4, 8),
    seed: int = 0,
):
    """Record `module` on `make_call(batch_size)` for every batch size (inputs drawn after `manual_seed(seed)`);
    returns (graph_spec, samples)."""
    torch.manual_seed(seed)
    recorder = GraphRecorder(module)
    with torch.no_grad():
        for batch in batch_sizes:
            args, kwargs = make_call(batch)
            with global_context:
                global_context.set(BATCH_SIZE_KEY, batch)
                recorder.record(args, kwargs, module(*args, **kwargs), batch_size=batch)
    assert len(recorder.graph_specs) == 1, recorder.graph_specs
    spec = recorder.graph_specs[0]
    return spec, recorder.samples(spec)


def mlp_call(batch: int, features: int = 32):
    return (torch.randn(batch, features),), {}


def block_call(batch: int, seq: int = 8, dim: int = 64):
    mask = torch.ones(batch, seq)
    mask[:, -2:] = 0
    return (torch.randn(batch, seq, dim),), {"mask": mask}


def image_call(batch: int, size: int = 16):
    return (torch.randn(batch, 3, size, size),), {}


def dict_call(batch: int):
    inputs = {"pixels": torch.randn(batch, 3, 8, 8), "tokens": torch.randint(0, 50, (batch, 5))}
    return (inputs,), {"bias": torch.randn(batch, 3), "scale": 0.5}
