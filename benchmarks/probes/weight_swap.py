"""What a LoRA-like weight swap costs a tuned module: refit (or nothing) per swap, next to a full re-tune.

A transformers block (a BertLayer from a small config, random weights) is wrapped with `aitune.torch.Module` and
tuned with one backend. Then its attention projections (query, key, value) are swapped `--swaps` times between
calls (odd swaps assign new Parameters, even swaps copy into the weights in place), and every call is compared
with an eager twin that got the same weights. Per backend the row reports:

- `tune_s`: the full tune (record, build, validate): what re-tuning from scratch after each swap would cost;
- `steady_ms`: the median latency of a call with no change;
- `swap_call_ms`: median / max latency of the first call after a swap: the change check, the refit of a backend
  that baked the weights (ONNX Runtime re-exports, TorchAO re-quantizes its copy) and the call itself; a backend
  that reads the weights at call time (Inductor) pays only the check;
- `max_abs_err`: the largest difference to the eager twin over every call (a stale answer would show here).

    python -m benchmarks.probes.weight_swap                          # CPU, every backend, 20 swaps
    python -m benchmarks.probes.weight_swap --backends onnxruntime --hidden 256 --device cuda

Results: a table on stdout and a JSON file (benchmarks/results/local/ unless `--out` names one), with the
environment header of benchmarks/common.py.
"""

from __future__ import annotations

import copy
import logging
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import common

PROJECTIONS = ("query", "key", "value")


def _backend(name: str) -> Any:
    if name == "onnxruntime":
        from aitune_core.backends.onnxruntime import ONNXRuntimeBackend

        return ONNXRuntimeBackend()
    if name == "torchao":
        from torchao.quantization import Int8WeightOnlyConfig

        from aitune_core.backends.torchao import TorchAOBackend, TorchAOBackendConfig

        return TorchAOBackend(TorchAOBackendConfig(quantization_config=Int8WeightOnlyConfig(), compile=False))
    if name == "inductor":
        from aitune_core.backends.torch_inductor import TorchInductorBackend

        return TorchInductorBackend()
    raise ValueError(name)


def build_block(hidden: int, device: torch.device) -> torch.nn.Module:
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertLayer

    config = BertConfig(hidden_size=hidden, num_attention_heads=max(1, hidden // 16), intermediate_size=hidden * 4,
                        attn_implementation="eager")  # a standalone layer: no attention-dispatch warning
    torch.manual_seed(0)
    return BertLayer(config).to(device).eval()


def swap(block: torch.nn.Module, twin: torch.nn.Module, step: int) -> None:
    """Give both modules new attention projections (a new adapter merged in)."""
    generator = torch.Generator().manual_seed(100 + step)
    for name in PROJECTIONS:
        weight = getattr(block.attention.self, name).weight
        new = (torch.randn(weight.shape, generator=generator) * 0.2).to(weight.device)
        for target in (block, twin):
            projection = getattr(target.attention.self, name)
            if step % 2:
                projection.weight = torch.nn.Parameter(new.clone(), requires_grad=False)
            else:
                with torch.no_grad():
                    projection.weight.copy_(new)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_ms(fn: Any, device: torch.device) -> tuple[float, Any]:
    _sync(device)
    start = time.perf_counter()
    out = fn()
    _sync(device)
    return (time.perf_counter() - start) * 1e3, out


def _error(got: Any, want: Any) -> float:
    got = got[0] if isinstance(got, tuple) else got
    want = want[0] if isinstance(want, tuple) else want
    return float((got.float() - want.float()).abs().max())


def run_backend(name: str, args: Any, device: torch.device) -> dict[str, Any]:
    from aitune_aot.module import Module
    from aitune_aot.registry import MODULE_REGISTRY
    from aitune_aot.tune import tune
    from aitune_core.strategies.one_backend import OneBackendStrategy

    MODULE_REGISTRY.clear()
    block = build_block(args.hidden, device)
    twin = copy.deepcopy(block)
    wrapped = Module(block, f"bert_layer_{name}")
    dataset = [torch.randn(args.seq, args.hidden, device=device) for _ in range(2)]
    start = time.perf_counter()
    tune(wrapped, dataset, batch_sizes=[args.batch], strategy=OneBackendStrategy(_backend(name)))
    tune_s = time.perf_counter() - start
    x = torch.randn(args.batch, args.seq, args.hidden, device=device)
    worst = 0.0
    with torch.no_grad():
        for _ in range(3):
            wrapped(x)
        steady = [_timed_ms(lambda: wrapped(x), device)[0] for _ in range(args.iters)]
        swaps = []
        for step in range(args.swaps):
            swap(block, twin, step)
            elapsed, out = _timed_ms(lambda: wrapped(x), device)
            swaps.append(elapsed)
            worst = max(worst, _error(out, twin(x)), _error(wrapped(x), twin(x)))
    return {
        "backend": name,
        "status": "ok",
        "tune_s": round(tune_s, 3),
        "steady_ms": round(statistics.median(steady), 3),
        "swap_call_ms_median": round(statistics.median(swaps), 3),
        "swap_call_ms_max": round(max(swaps), 3),
        "swaps": args.swaps,
        "max_abs_err": worst,
        "serving_after_swaps": not wrapped._self_dispatcher.watch.stale(),
    }


def format_table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'backend':<12} {'tune s':>8} {'steady ms':>10} {'swap ms (med)':>14} {'swap ms (max)':>14} "
             f"{'max abs err':>12}"]
    for row in rows:
        if row["status"] != "ok":
            lines.append(f"{row['backend']:<12} {row['status']}: {row.get('error', '')}")
            continue
        lines.append(f"{row['backend']:<12} {row['tune_s']:>8.2f} {row['steady_ms']:>10.3f} "
                     f"{row['swap_call_ms_median']:>14.1f} {row['swap_call_ms_max']:>14.1f} "
                     f"{row['max_abs_err']:>12.2e}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--backends", nargs="+", default=["onnxruntime", "torchao", "inductor"],
                        choices=("onnxruntime", "torchao", "inductor"))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--swaps", type=int, default=20)
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s - %(levelname)s - %(message)s")

    from aitune_core.config import config

    header = common.environment("weight_swap", str(device), args.git_commit)
    out = common.result_path(header, f"h{args.hidden}", out=args.out)
    doc: dict[str, Any] = {**header, "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                           "rows": []}
    cache_dir = Path(tempfile.mkdtemp(prefix="aitune-weight-swap-"))
    try:
        with config.override(cache_dir=cache_dir):
            for name in args.backends:
                try:
                    doc["rows"].append(run_backend(name, args, device))
                except Exception as exc:  # one backend's failure is a row, not the end of the run
                    doc["rows"].append({"backend": name, "status": "failed", "error": f"{type(exc).__name__}: {exc}"})
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    print(format_table(doc["rows"]))
    common.write_result(out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
