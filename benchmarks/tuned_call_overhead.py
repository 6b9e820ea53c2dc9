"""Where does a JIT-tuned call spend its time compared with a hand-written `torch.compile`?

Side by side in one process, on the same model copy and inputs:

    eager                         the module as the user wrote it
    compile:<mode>                torch.compile(module, mode=<mode>) called directly
    jit (hook)                    the same module JIT-tuned through the `Module.__call__` patch (default config)
    jit backend.infer             the chosen backend called directly (no hook, no dispatcher)

The difference between the last two is aitune's per-call dispatch cost; between `compile:<mode>` and
`jit backend.infer` it is what the backend adds (output copies for CUDA graphs, autocast, mode checks). With
`--mode reduce-overhead` on CUDA three more rows split that: the backend's compiled module called directly, then
with `cudagraph_mark_step_begin()` before it, then also with the output copy after it.

    python benchmarks/tuned_call_overhead.py --model resnet50 --batches 1 32          # GPU
    python benchmarks/tuned_call_overhead.py --model tiny_resnet --batches 1 --device cpu
    python benchmarks/tuned_call_overhead.py --model micro --batches 2 --device cpu --mode default

`micro` is one Linear(8, 8) + ReLU (tuned with `min_parameters=0`): its forward costs microseconds, so the rows
expose aitune's per-call cost.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import logging
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import models
import timing


class _Micro(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def _build(name: str, batch: int, device: str) -> tuple[torch.nn.Module, models.Batch]:
    if name == "micro":
        torch.manual_seed(models.MODEL_SEED)
        return _Micro().to(device).eval(), models.Batch((torch.randn(batch, 8, device=device),))
    built = models.build(name, batch)
    return built.module.to(device).eval(), built.make_inputs(0).to(device)


def _with_mark_step(fn, clone: bool = False):
    """`fn` preceded by `cudagraph_mark_step_begin()` and optionally followed by a clone of its output tensors."""

    def call(*args, **kwargs):
        torch.compiler.cudagraph_mark_step_begin()
        out = fn(*args, **kwargs)
        if clone:
            from aitune_core.specs.tree import tree_map

            out = out.clone() if type(out) is torch.Tensor else tree_map(torch.Tensor.clone, out)
        return out

    return call


def median_ms(fn, batch: models.Batch, device: str, iters: int) -> float:
    """Median of `iters` timed synchronous calls after a warm-up (CUDA events on a GPU)."""
    call = models.caller(fn, torch.device(device).type)
    with torch.no_grad():
        result = timing.serve_loop(call, [batch], device, warmup=20, iters=iters, settle=20)
    return result.stats.median_ms


def write_result(benchmark: str, out: str | Path, device: str, rows: list[dict], **extra: object) -> None:
    """The results JSON of a per-call benchmark: name, date, device, torch version, rows."""
    result = {
        "benchmark": benchmark,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu",
        "torch": torch.__version__,
        **extra,
        "rows": rows,
    }
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--mode", default="reduce-overhead")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--settle", type=int, default=20, help="stable calls that end the warm-up")
    parser.add_argument("--early-stop", type=float, default=None,
                        help="override the JIT's CUDA early-stop speedup (aitune_jit.config.CUDA_EARLY_STOP_SPEEDUP)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "tuned_call_overhead.json"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    import aitune.torch.jit as jit
    import aitune_jit.config
    from aitune.torch import PatchedModule, jit_config

    if args.early_stop is not None:
        aitune_jit.config.CUDA_EARLY_STOP_SPEEDUP = args.early_stop

    rows = []
    for batch in args.batches:
        base, x = _build(args.model, batch, args.device)
        row: dict[str, float | int | str] = {"model": args.model, "batch": batch,
                                             "early_stop": aitune_jit.config.CUDA_EARLY_STOP_SPEEDUP}
        row["eager_ms"] = median_ms(base, x, args.device, args.iters)
        compiled = torch.compile(copy.deepcopy(base), mode=None if args.mode == "default" else args.mode)
        row[f"compile_{args.mode}_ms"] = median_ms(compiled, x, args.device, args.iters)

        jit_config.device = args.device
        if args.model == "micro":
            jit_config.min_parameters = 0  # 72 parameters: below the default threshold on purpose
        jit.enable()
        try:
            tuned = copy.deepcopy(base)
            with torch.no_grad():
                for _ in range(jit_config.min_samples + 3):
                    tuned(*x.args, **x.kwargs)
            node = PatchedModule.of(tuned)
            row["jit_state"] = str(node.state) if node is not None else "not a node"
            row["jit_hook_ms"] = median_ms(tuned, x, args.device, args.iters)
            backends = node.backends if node is not None else []
            if backends:
                backend = backends[0]
                row["jit_backend"] = backend.describe()
                row["jit_backend_infer_ms"] = median_ms(backend.infer, x, args.device, args.iters)
                inner = getattr(backend, "_compiled", None)
                if inner is not None and args.mode == "reduce-overhead" and args.device.startswith("cuda"):
                    # what the backend adds around the same compiled code, one piece at a time
                    row["jit_compiled_direct_ms"] = median_ms(inner, x, args.device, args.iters)
                    row["jit_compiled_mark_step_ms"] = median_ms(_with_mark_step(inner), x, args.device, args.iters)
                    row["jit_compiled_mark_step_clone_ms"] = median_ms(
                        _with_mark_step(inner, clone=True), x, args.device, args.iters
                    )
        finally:
            jit.disable()
        rows.append(row)
        print(json.dumps(row))

    write_result("tuned_call_overhead", args.out, args.device, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
