"""Whole-model torch.compile with and without repeated blocks as nested compile regions: compile time and speed.

    python -m benchmarks.probes.compile_regions [--models bert_base resnet50] [--batch 8] [--mode reduce-overhead]
        [--repeats 1] [--warm] [--out FILE]

What `aitune_core.backends.compile_regions` buys where the JIT compiles a model whole: for each model, fresh
processes (each with an empty Inductor cache, so the first call is a cold compile) compile it as a user would
(`torch.compile(model, mode=...)`), once plainly and once with `CompileRegions.install(model)` first. Reported per
process: blocks marked, the first call's time (the compile), the median of `--calls` later calls (synchronized),
and the largest difference from eager on the same input. With `--warm`, each cold process is followed by a second
one on the same Inductor cache: its first call is the warm compile a restarted process pays (dynamo's trace and
the cache lookups, where regions cost dynamo a speculative trace per block). The variants alternate (plain,
regions, plain, ...); ratios compare medians. Cross-process GPU latency varies by up to 20 % on the same tree
(docs/benchmarks.md), so a steady-state ratio within that band is no difference. `--models` takes names from
benchmarks/suite/models.py and `llama24` (a 24-layer tiny LlamaModel, the CPU case of issue 15).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import common

VARIANTS = ("plain", "regions")


def _model(name: str, batch: int) -> tuple[torch.nn.Module, tuple, dict]:
    if name == "llama24":
        from transformers import LlamaConfig, LlamaModel

        config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=24, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=96, max_position_embeddings=256)
        torch.manual_seed(0)
        ids = torch.randint(0, 96, (batch, 32), generator=torch.Generator().manual_seed(1))
        return LlamaModel(config).eval(), (ids,), {"use_cache": False}
    from benchmarks.suite import models

    built = models.build(name, batch)
    inputs = built.make_inputs(0)
    return built.module.eval(), inputs.args, inputs.kwargs


def measure(name: str, variant: str, batch: int, mode: str, calls: int, device: str) -> dict[str, Any]:
    """One process's row (runs in the child)."""
    from aitune_core.backends.compile_regions import CompileRegions
    from benchmarks.suite.models import primary_output

    module, args, kwargs = _model(name, batch)
    module = module.to(device)
    args = tuple(a.to(device) for a in args)
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    with torch.no_grad():
        expected = primary_output(module(*args, **kwargs)).float()
        regions = CompileRegions.install(module) if variant == "regions" else None
        compiled = torch.compile(module, mode=None if mode == "default" else mode)
        sync()
        start = time.perf_counter()
        out = primary_output(compiled(*args, **kwargs)).float()
        sync()
        compile_s = time.perf_counter() - start
        diff = float((out - expected).abs().max())
        times = []
        for _ in range(calls):
            sync()
            start = time.perf_counter()
            compiled(*args, **kwargs)
            sync()
            times.append(time.perf_counter() - start)
    return {"model": name, "variant": variant, "blocks": regions.blocks if regions else 0,
            "groups": regions.groups if regions else 0, "compile_s": compile_s,
            "steady_ms": 1e3 * statistics.median(times[len(times) // 5:]), "max_abs_diff": diff}


def _child(name: str, variant: str, args: Any, cache: Path, phase: str) -> dict[str, Any]:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache))
    command = [sys.executable, "-m", "benchmarks.probes.compile_regions", "--child", name, variant,
               "--batch", str(args.batch), "--mode", args.mode, "--calls", str(args.calls), "--device", args.device]
    try:
        done = subprocess.run(command, env=env, cwd=common.REPO, capture_output=True, text=True,
                              timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"model": name, "variant": variant, "phase": phase, "error": f"no result within {args.timeout}s"}
    line = next((ln for ln in done.stdout.splitlines() if ln.startswith("ROW ")), None)
    if line is None:
        return {"model": name, "variant": variant, "phase": phase, "error": done.stderr[-1500:]}
    return {**json.loads(line[4:]), "phase": phase}


def _summary(rows: list[dict[str, Any]], names: list[str]) -> list[dict[str, Any]]:
    summary = []
    for name in names:
        got = {v: [r for r in rows if r["model"] == name and r["variant"] == v and r.get("phase") == "cold"
                   and "error" not in r] for v in VARIANTS}
        if not all(got.values()):
            continue
        med = {v: {k: statistics.median(r[k] for r in got[v]) for k in ("compile_s", "steady_ms")} for v in VARIANTS}
        warm = {v: [r["compile_s"] for r in rows if r["model"] == name and r["variant"] == v
                    and r.get("phase") == "warm" and "error" not in r] for v in VARIANTS}
        for v in VARIANTS:
            med[v]["warm_compile_s"] = statistics.median(warm[v]) if warm[v] else None
        warm_ratio = (med["regions"]["warm_compile_s"] / med["plain"]["warm_compile_s"]
                      if all(warm.values()) else None)
        summary.append({"model": name, "blocks": got["regions"][0]["blocks"],
                        "compile_regions_over_plain": med["regions"]["compile_s"] / med["plain"]["compile_s"],
                        "warm_compile_regions_over_plain": warm_ratio,
                        "steady_regions_over_plain": med["regions"]["steady_ms"] / med["plain"]["steady_ms"],
                        **{f"{v}_{k}": med[v][k] for v in VARIANTS for k in med[v]}})
    return summary


def _table(summary: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="whole-model compile: plain vs repeated blocks as nested compile regions (medians)")
    for column in ("model", "blocks", "compile s plain", "compile s regions", "ratio", "warm s plain",
                   "warm s regions", "ratio", "steady ms plain", "steady ms regions", "ratio"):
        table.add_column(column)

    def fmt(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    for row in summary:
        table.add_row(row["model"], str(row["blocks"]), f"{row['plain_compile_s']:.1f}",
                      f"{row['regions_compile_s']:.1f}", f"{row['compile_regions_over_plain']:.2f}",
                      fmt(row["plain_warm_compile_s"], ".1f"), fmt(row["regions_warm_compile_s"], ".1f"),
                      fmt(row["warm_compile_regions_over_plain"], ".2f"),
                      f"{row['plain_steady_ms']:.3f}", f"{row['regions_steady_ms']:.3f}",
                      f"{row['steady_regions_over_plain']:.2f}")
    Console(width=140).print(table)


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--child", nargs=2, metavar=("MODEL", "VARIANT"), help=argparse_hidden())
    p.add_argument("--models", nargs="+", default=["bert_base", "resnet50"])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--mode", default="reduce-overhead", choices=["default", "reduce-overhead", "max-autotune"])
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--warm", action="store_true",
                   help="after each cold process, a second one on the same Inductor cache (the warm first call)")
    args = p.parse_args(argv)
    if args.child:
        print("ROW " + json.dumps(measure(*args.child, args.batch, args.mode, args.calls, args.device)))
        return 0
    header = common.environment("compile_regions", args.device, args.git_commit)
    rows = []
    with tempfile.TemporaryDirectory(prefix="aitune-regions-") as tmp:
        for _ in range(args.repeats):
            for name in args.models:
                for variant in VARIANTS:
                    cache = Path(tmp) / f"inductor-{name}-{variant}-{time.time_ns()}"
                    for phase in ("cold", "warm") if args.warm else ("cold",):
                        rows.append(_child(name, variant, args, cache, phase))
                        print(json.dumps(rows[-1])[:300], flush=True)
    summary = _summary(rows, args.models)
    _table(summary)
    document = {**header, "args": {k: str(v) for k, v in vars(args).items()}, "summary": summary, "rows": rows}
    common.write_result(common.result_path(header, *args.models, args.mode, out=args.out), document)
    return 0


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    raise SystemExit(main())
