"""What the stepping-aside gate costs a background tuning job when no request is in flight.

A background job steps aside while requests are served (`aitune_jit/worker_yield.py`). Its gate runs at the job
thread's Python calls even when nothing is served, and that cost is paid on every job. This probe times the
same warm job (the JIT cache filled by a first process, so the job is torch.compile's warm path: dynamo's
trace, the AOTAutograd and FX graph caches, the validation) in fresh processes under each gate:

- `none`: `AITUNE_WORKER_YIELD_MS=0`, no gate;
- `trace`: `AITUNE_WORKER_YIELD_GATE=trace`, the job thread's trace function (Python function calls only);
- `profile`: `AITUNE_WORKER_YIELD_GATE=profile`, the job thread's profile function;
- `monitoring`: the default, a `sys.monitoring` callback on function starts (Python 3.12+; on an older Python
  this row is the trace function again, and the table says so).

Each process calls the model `jit_config.min_samples` times (the last call queues the job), then serves nothing
and waits for it (`wait_until_tuned`): the time is from the first call to tuned. Variants are interleaved round
by round.

    python -m benchmarks.probes.step_aside_cost --device cpu --model tiny_resnet
    python -m benchmarks.probes.step_aside_cost --device cuda --model resnet50 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import common

VARIANTS = {
    "none": {"AITUNE_WORKER_YIELD_MS": "0"},
    "trace": {"AITUNE_WORKER_YIELD_GATE": "trace"},
    "profile": {"AITUNE_WORKER_YIELD_GATE": "profile"},
    "monitoring": {"AITUNE_WORKER_YIELD_GATE": "monitoring"},
}
MARK = "STEP_ASIDE_COST "


def child(model_name: str, device_name: str) -> int:
    """One process: the model under the JIT, called until its job is queued, then waited for."""
    import torch

    import aitune.torch.jit.enable  # noqa: F401  (the zero-code switch, as a user turns it on)
    from aitune.torch import PatchedModule, jit_config
    from aitune.torch.jit import wait_until_tuned
    from benchmarks.suite import models

    device = torch.device(device_name)
    built = models.build(model_name, 1)
    module = built.module.to(device)
    size = 224 if model_name == "resnet50" else 32
    x = torch.randn(1, 3, size, size, device=device)
    with torch.no_grad():
        begin = time.perf_counter()
        for _ in range(jit_config.min_samples):  # the call that completes min_samples queues the job
            module(x)
        queued = time.perf_counter() - begin
        tuned = wait_until_tuned(timeout=600)
        took = time.perf_counter() - begin
    node = PatchedModule.of(module)
    gate = _gate_used()
    print(MARK + json.dumps({"time_to_tuned_s": took, "queued_after_s": queued, "tuned": bool(tuned),
                             "state": node.state.value if node is not None else None, "gate": gate}), flush=True)
    return 0


def _gate_used() -> str:
    """The gate this process's job ran under, from the variables `VARIANTS` sets (monitoring needs 3.12+)."""
    if os.environ.get("AITUNE_WORKER_YIELD_MS") == "0":
        return "none"
    wanted = os.environ.get("AITUNE_WORKER_YIELD_GATE", "monitoring")
    if wanted == "monitoring":
        return "monitoring" if sys.version_info >= (3, 12) else "trace"
    return wanted


def _run(variant: str, args: Any, cache: Path) -> dict[str, Any]:
    env = {**os.environ, "AITUNE_JIT_CACHE_DIR": str(cache), "PYTHONUNBUFFERED": "1", **VARIANTS[variant]}
    env.pop("AITUNE_JIT_BLOCKING", None)
    if variant != "none":
        env.pop("AITUNE_WORKER_YIELD_MS", None)
    command = [sys.executable, "-m", "benchmarks.probes.step_aside_cost", "--child", "--model", args.model,
               "--device", args.device]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout_s,
                          cwd=common.REPO)
    for line in done.stdout.splitlines():
        if line.startswith(MARK):
            return {"variant": variant, **json.loads(line[len(MARK):])}
    return {"variant": variant, "error": (done.stderr or done.stdout)[-2000:], "exit_status": done.returncode}


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--model", default="tiny_resnet")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", nargs="+", choices=tuple(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--timeout-s", type=float, default=900)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.model, args.device)

    with tempfile.TemporaryDirectory(prefix="aitune-step-aside-") as folder:
        cache = Path(folder)
        fill = _run("none", args, cache)  # the cold job that fills the cache; reported, not compared
        print(f"cache filled: {fill}", flush=True)
        runs = []
        for index in range(args.rounds):
            for variant in args.variants:
                result = _run(variant, args, cache)
                result["round"] = index
                runs.append(result)
                print(json.dumps(result)[:300], flush=True)

    summary = _summary(runs, args.variants)
    header = common.environment("step_aside_cost", args.device)
    _print(summary, header, args.model)
    doc = {**header, "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
           "model": args.model, "cold_fill": fill, "runs": runs, "summary": summary}
    common.write_result(common.result_path(header, args.model, out=args.out), doc)
    return 0


def _summary(runs: list[dict[str, Any]], variants: list[str]) -> list[dict[str, Any]]:
    rows = []
    times = {v: [r["time_to_tuned_s"] for r in runs if r["variant"] == v and r.get("tuned")] for v in variants}
    base = statistics.median(times["none"]) if times.get("none") else None
    for variant in variants:
        values = times[variant]
        gates = sorted({r.get("gate", "?") for r in runs if r["variant"] == variant})
        median = statistics.median(values) if values else None
        rows.append({"variant": variant, "gate": "/".join(gates), "runs": len(values),
                     "times_s": [round(v, 2) for v in values],
                     "median_s": round(median, 2) if median is not None else None,
                     "over_none": round(median / base, 3) if median is not None and base else None})
    return rows


def _print(summary: list[dict[str, Any]], header: dict[str, Any], model: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"warm background job of {model}, time to tuned (s), {header['device']['name']}, "
                        f"Python {header['python']}")
    for column in ("variant", "gate used", "runs (s)", "median (s)", "/ none"):
        table.add_column(column)
    for row in summary:
        table.add_row(row["variant"], row["gate"], ", ".join(f"{t:.2f}" for t in row["times_s"]),
                      "-" if row["median_s"] is None else f"{row['median_s']:.2f}",
                      "-" if row["over_none"] is None else f"{row['over_none']:.2f}")
    Console().print(table)


if __name__ == "__main__":
    raise SystemExit(main())
