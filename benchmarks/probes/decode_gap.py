"""Where a tuned GPT-2 `generate()` spends its host time under the JIT and under `torch.compile`, side by side.

    python -m benchmarks.probes.decode_gap --device cuda --rounds 3 --iters 10 --profile-iters 3

Why: on an H200 a 32-token greedy `generate()` of GPT-2 took 132 ms under the JIT against 102 ms with
`model.compile()` (`real_workloads-speed-h200-gpt2-final-eec6554.json`), about 0.9 ms more per decoding step,
while both ran the same compiled decode graph (on the CPU: the same FX graph hash) and the GPU was idle most of
the time (a host-bound loop). So the difference is host work around the graph. This probe runs each contender
in fresh processes (rounds alternate the order), times `--iters` requests (`generate_call.py`: 32 steps after a
16-token prompt), then profiles `--profile-iters` more under `cProfile` and reports, per contender, the host
time per request by area (aitune, dynamo, Inductor's runtime, transformers, other torch, the rest) and the
functions with the most own time, so the two lists can be read against each other.

Contenders: `jit` (`import aitune.torch.jit.enable`, blocking tuning; warmed until the worker is idle and the
decoder is served tuned) and `compile` (`model.compile()` in place, as a torch.compile user writes it).
Results: a new file under the local results folder (`benchmarks/common.py`; `--out` to name one).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import common
from benchmarks.probes import generate_call

CONTENDERS = ("jit", "compile")
#: (area, substring of a profiled function's file path); the first that matches names the area
AREAS = (
    ("aitune", "/aitune"),
    ("dynamo", "/torch/_dynamo/"),
    ("inductor runtime", "/torch/_inductor/"),
    ("transformers", "/transformers/"),
    ("torch other", "/torch/"),
)
TOP = 25


def _area(filename: str) -> str:
    for name, mark in AREAS:
        if mark in filename:
            return name
    return "builtins" if filename == "~" else "other"


def _short(func: tuple[str, int, str]) -> str:
    filename, line, name = func
    parts = Path(filename).parts
    return f"{'/'.join(parts[-2:])}:{line} {name}" if filename != "~" else name


def _profile_summary(profiler: cProfile.Profile, requests: int) -> dict[str, Any]:
    stats = pstats.Stats(profiler).stats  # {func: (cc, nc, tottime, cumtime, callers)}
    areas: dict[str, float] = {}
    rows = []
    for func, (_cc, calls, tottime, cumtime, _callers) in stats.items():
        area = _area(func[0])
        areas[area] = areas.get(area, 0.0) + tottime
        rows.append((tottime, calls, cumtime, func))
    rows.sort(key=lambda row: row[0], reverse=True)
    return {
        "own_ms_per_request": {_short(func): round(1e3 * tot / requests, 4) for tot, _calls, _cum, func in rows
                               if 1e3 * tot / requests >= 0.02},
        "ms_per_request_by_area": {k: round(1e3 * v / requests, 3) for k, v in sorted(areas.items())},
        "top_own_time": [
            {"function": _short(func), "area": _area(func[0]), "own_ms_per_request": round(1e3 * tot / requests, 4),
             "cum_ms_per_request": round(1e3 * cum / requests, 4), "calls_per_request": round(calls / requests, 2)}
            for tot, calls, cum, func in rows[:TOP]
        ],
        "aitune_cumulative": [
            {"function": _short(func), "cum_ms_per_request": round(1e3 * cum / requests, 4),
             "calls_per_request": round(calls / requests, 2)}
            for _tot, calls, cum, func in sorted(rows, key=lambda row: row[2], reverse=True)
            if _area(func[0]) == "aitune"
        ][:TOP],
    }


def _worker_idle() -> bool:
    worker = sys.modules.get("aitune_jit.worker")
    return worker is None or not worker.pending()


def serve(args: argparse.Namespace) -> int:
    """One contender's process: warm up, time `--iters` requests, profile `--profile-iters` more."""
    if args.serve == "jit":
        os.environ.setdefault("AITUNE_JIT_BLOCKING", "1")
        import aitune.torch.jit.enable  # noqa: F401  (the public zero-code entry point)
    device = torch.device(args.device)
    model, request = generate_call.build(device)
    if args.serve == "compile":
        model.compile()
    for _ in range(args.warmup):
        request()
    deadline = time.perf_counter() + 300
    while not _worker_idle() and time.perf_counter() < deadline:
        request()
    latencies, busy = [], 0
    collections: list[tuple[int, float]] = []  # (generation, ms) of the collections during the timed requests
    started: list[float] = []

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            collections.append((info["generation"], 1e3 * (time.perf_counter() - started.pop())))

    gc.callbacks.append(on_gc)
    for _ in range(args.iters):
        busy += not _worker_idle()
        start = time.perf_counter()
        request()
        if device.type == "cuda":
            torch.cuda.synchronize()
        latencies.append(1e3 * (time.perf_counter() - start))
    gc.callbacks.remove(on_gc)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.profile_iters):
        request()
    if device.type == "cuda":
        torch.cuda.synchronize()
    profiler.disable()
    result = {"median_ms": statistics.median(latencies), "latencies_ms": latencies, "worker_busy_requests": busy,
              "collections_ms_by_generation": {g: round(sum(ms for gen, ms in collections if gen == g), 2)
                                               for g in (0, 1, 2)},
              "collections": len(collections), "objects_tracked": len(gc.get_objects())}
    if args.profile_iters:
        result["profile"] = _profile_summary(profiler, args.profile_iters)
    Path(args.out_serve).write_text(json.dumps(result))
    return 0


def _spawn(name: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("AUTOWRAPT_BOOTSTRAP", None)
    env["AITUNE_JIT_CACHE_DIR"] = str(out.parent / f"cache-{name}")
    command = [sys.executable, "-m", "benchmarks.probes.decode_gap", "--serve", name, "--device", args.device,
               "--warmup", str(args.warmup), "--iters", str(args.iters), "--profile-iters", str(args.profile_iters),
               "--out-serve", str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout_s)
    if done.returncode != 0:
        return {"error": done.stderr[-3000:]}
    result = json.loads(out.read_text())
    result["aitune_lines"] = [line for line in done.stderr.splitlines() if "aitune" in line or "  " in line[:4]][-20:]
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warmup", type=int, default=8, help="requests before timing (JIT: then until the worker is idle)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--profile-iters", type=int, default=3)
    p.add_argument("--timeout-s", type=float, default=900)
    p.add_argument("--git-commit", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--serve", choices=CONTENDERS, help=argparse.SUPPRESS)
    p.add_argument("--out-serve", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        return serve(args)
    import tempfile

    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONTENDERS}
    with tempfile.TemporaryDirectory(prefix="decode-gap-") as scratch:
        for r in range(args.rounds):
            order = CONTENDERS if r % 2 == 0 else CONTENDERS[::-1]
            for name in order:
                got = _spawn(name, args, Path(scratch) / f"{name}-{r}.json")
                runs[name].append(got)
                print(f"round {r} {name}: " + (f"{got['median_ms']:.2f} ms" if "median_ms" in got else got["error"]),
                      flush=True)
    medians = {n: [g["median_ms"] for g in runs[n] if "median_ms" in g] for n in CONTENDERS}
    ratio = (statistics.median(medians["jit"]) / statistics.median(medians["compile"])
             if medians["jit"] and medians["compile"] else None)
    _table(runs, medians, ratio)
    header = common.environment("decode_gap", args.device, args.git_commit)
    result = {**header, "medians_ms": medians, "jit_over_compile_time": ratio, "runs": runs}
    common.write_result(common.result_path(header, out=Path(args.out) if args.out else None), result)
    return 0


def _table(runs: dict[str, list[dict[str, Any]]], medians: dict[str, list[float]], ratio: float | None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="generate(): host time per request by area (cProfile, last round)")
    table.add_column("area")
    for name in CONTENDERS:
        table.add_column(f"{name} ms")
    last = {n: next((g for g in reversed(runs[n]) if "profile" in g), None) for n in CONTENDERS}
    areas = sorted({a for g in last.values() if g for a in g["profile"]["ms_per_request_by_area"]})
    for area in areas:
        table.add_row(area, *(f"{g['profile']['ms_per_request_by_area'].get(area, 0.0):.2f}" if g else "-"
                              for g in last.values()))
    table.add_row("median request (timed)", *(f"{statistics.median(medians[n]):.2f}" if medians[n] else "-"
                                              for n in CONTENDERS))
    Console().print(table)
    if ratio is not None:
        Console().print(f"jit / compile request time: {ratio:.3f}")


if __name__ == "__main__":
    raise SystemExit(main())
