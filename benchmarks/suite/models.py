"""Model factories for the benchmark suites: the GPU models and tiny CPU stand-ins.

Plain PyTorch only (no aitune import): the workload script uses these factories too, so the model a
contender runs is built by the same code in every process. Every factory seeds torch before building,
so two processes that build the same model get the same random weights (checked through
`weights_checksum`). Nothing is downloaded: timm gets `pretrained=False`, torchvision `weights=None`,
transformers a bare `BertConfig`.

A factory returns a `BuiltModel`; `make_inputs(seed)` returns a `Batch` of seeded random data (never
zeros) with the model's batch size. A missing package raises `ModelUnavailable` with the reason that
the suite records as 'skipped: ...'.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

MODEL_SEED = 1234


class ModelUnavailable(RuntimeError):
    """The model cannot be built here (a package is missing); the message says why."""


@dataclasses.dataclass
class Batch:
    """One call's inputs: `model(*args, **kwargs)`."""

    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)

    def to(self, device: torch.device | str) -> Batch:
        return Batch(tuple(a.to(device) for a in self.args), {k: v.to(device) for k, v in self.kwargs.items()})


@dataclasses.dataclass
class BuiltModel:
    name: str
    source: str  # which library/factory built it, e.g. "timm.resnet50" or "torchvision.resnet50 (timm missing)"
    module: nn.Module
    batch: int
    make_inputs: Callable[[int], Batch]  # seed -> inputs on CPU


def _image_inputs(batch: int, size: int) -> Callable[[int], Batch]:
    def make(seed: int) -> Batch:
        g = torch.Generator().manual_seed(seed)
        return Batch((torch.randn(batch, 3, size, size, generator=g),))

    return make


def _token_inputs(batch: int, seq_len: int, vocab: int) -> Callable[[int], Batch]:
    def make(seed: int) -> Batch:
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(1, vocab, (batch, seq_len), generator=g)
        # A ragged mask (each row keeps a random-length prefix, at least half the sequence) exercises the
        # masking path with real data instead of an all-ones tensor.
        lengths = torch.randint(seq_len // 2, seq_len + 1, (batch,), generator=g)
        mask = (torch.arange(seq_len)[None, :] < lengths[:, None]).to(torch.long)
        return Batch(kwargs={"input_ids": ids, "attention_mask": mask})

    return make


# ----------------------------------------------------------------------------------------------- GPU models


def _timm_or_torchvision(timm_name: str, tv_name: str) -> tuple[nn.Module, str]:
    try:
        import timm
    except ImportError as exc:
        timm_reason = f"timm missing ({exc.name})"
    else:
        return timm.create_model(timm_name, pretrained=False), f"timm {timm.__version__} {timm_name}"
    try:
        import torchvision
    except ImportError as exc:
        raise ModelUnavailable(f"{timm_reason}; torchvision missing too ({exc.name})") from exc
    factory = getattr(torchvision.models, tv_name)
    return factory(weights=None), f"torchvision {torchvision.__version__} {tv_name} ({timm_reason})"


def resnet50(batch: int) -> BuiltModel:
    torch.manual_seed(MODEL_SEED)
    module, source = _timm_or_torchvision("resnet50", "resnet50")
    return BuiltModel("resnet50", source, module.eval(), batch, _image_inputs(batch, 224))


def vit_base(batch: int) -> BuiltModel:
    torch.manual_seed(MODEL_SEED)
    module, source = _timm_or_torchvision("vit_base_patch16_224", "vit_b_16")
    return BuiltModel("vit_base", source, module.eval(), batch, _image_inputs(batch, 224))


def _bert(name: str, batch: int, seq_len: int, **config: Any) -> BuiltModel:
    try:
        import transformers
        from transformers import BertConfig, BertModel
    except ImportError as exc:
        raise ModelUnavailable(f"transformers missing ({exc.name})") from exc
    torch.manual_seed(MODEL_SEED)
    cfg = BertConfig(**config)
    module = BertModel(cfg).eval()
    overrides = ", ".join(f"{k}={v}" for k, v in config.items())
    source = f"transformers {transformers.__version__} BertModel(BertConfig({overrides})) seq={seq_len}"
    return BuiltModel(name, source, module, batch, _token_inputs(batch, seq_len, cfg.vocab_size))


def bert_base(batch: int) -> BuiltModel:
    return _bert("bert_base", batch, 128)


# ------------------------------------------------------------------------------------------- tiny CPU models


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.short(x))


class TinyResNet(nn.Module):
    """A 4-block residual CNN on 3x32x32 images (about 0.2M parameters)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layers = nn.Sequential(_Block(16, 32, 1), _Block(32, 32, 1), _Block(32, 64, 2), _Block(64, 64, 1))
        self.head = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.stem(x)).mean(dim=(2, 3)))


class TinyViT(nn.Module):
    """Patch embedding + 2 pre-norm transformer layers + class head on 3x32x32 images."""

    def __init__(self, dim: int = 64, depth: int = 2, heads: int = 4, patch: int = 4, num_classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, dim, patch, patch)
        self.pos = nn.Parameter(torch.randn(1, (32 // patch) ** 2, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, dim * 2, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x).flatten(2).transpose(1, 2) + self.pos
        return self.head(self.norm(self.encoder(tokens)).mean(dim=1))


def tiny_resnet(batch: int) -> BuiltModel:
    torch.manual_seed(MODEL_SEED)
    module = TinyResNet().eval()
    return BuiltModel("tiny_resnet", "benchmarks.suite.models.TinyResNet", module, batch, _image_inputs(batch, 32))


def tiny_vit(batch: int) -> BuiltModel:
    torch.manual_seed(MODEL_SEED)
    return BuiltModel("tiny_vit", "benchmarks.suite.models.TinyViT", TinyViT().eval(), batch, _image_inputs(batch, 32))


def tiny_bert(batch: int) -> BuiltModel:
    return _bert("tiny_bert", batch, 32, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=128, vocab_size=1000, max_position_embeddings=64)


GPU_MODELS: dict[str, Callable[[int], BuiltModel]] = {
    "resnet50": resnet50,
    "vit_base": vit_base,
    "bert_base": bert_base,
}
CPU_MODELS: dict[str, Callable[[int], BuiltModel]] = {
    "tiny_resnet": tiny_resnet,
    "tiny_vit": tiny_vit,
    "tiny_bert": tiny_bert,
}
ALL_MODELS = {**GPU_MODELS, **CPU_MODELS}


def build(name: str, batch: int) -> BuiltModel:
    try:
        factory = ALL_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(ALL_MODELS)}") from None
    return factory(batch)


def weights_checksum(module: nn.Module) -> float:
    """Sum of every parameter and buffer in float64: equal across processes iff the weights are equal."""
    with torch.no_grad():
        return float(sum(t.detach().double().sum().item() for t in [*module.parameters(), *module.buffers()]))


def caller(target: Callable[..., Any], device_type: str, autocast: str = "none") -> Callable[[Batch], Any]:
    """`call(batch)` = `target(*batch.args, **batch.kwargs)`, inside bf16 autocast when `autocast` is "bf16"."""
    if autocast == "bf16":
        def call(b: Batch) -> Any:
            with torch.autocast(device_type, dtype=torch.bfloat16):
                return target(*b.args, **b.kwargs)
    elif autocast == "none":
        def call(b: Batch) -> Any:
            return target(*b.args, **b.kwargs)
    else:
        raise ValueError(f"autocast must be 'none' or 'bf16', got {autocast!r}")
    return call


def primary_output(out: Any) -> torch.Tensor:
    """The tensor a correctness check compares: the output itself, or the first tensor of a tuple/ModelOutput."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):  # transformers ModelOutput is an OrderedDict
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        for item in out:
            if isinstance(item, torch.Tensor):
                return item
    raise TypeError(f"no tensor in model output of type {type(out).__name__}")
