"""How much does a contender's median move from one process to the next? JIT vs torch.compile, repeated.

The suite measures each contender once. At small batches, where a call costs well under a millisecond of
GPU time, the host decides the latency, and one GPU host can measure the same JIT workload a third apart in
two consecutive processes (docs/benchmarks.md has such runs). A single side-by-side figure then says little.
This script runs the plain workload script (benchmarks/suite/workloads/serve.py) `--repeats` times
per contender, alternating the contenders and reversing their order on every other round so that drift on
the host hits both alike, and reports per contender every run's median, the median of those medians and
their spread, and per round the ratio of the JIT to the comparator measured next to it.

    python -m benchmarks.probes.repeatability --model resnet50 --batches 1 8 --repeats 3        # GPU
    python -m benchmarks.probes.repeatability --model tiny_resnet --batches 2 --repeats 2 --device cpu \\
        --contenders aitune-jit "compile:default (workload)"

All runs share one Inductor cache folder (first compiles are paid once; this script does not measure
time-to-tuned, the suite does), unless `--fresh-cache` gives every process an empty one of its own, as each
suite run has: then every process makes its own autotuning choices. `--profile-calls N` has every process
profile N more calls after serving and adds its GPU and host time per call to the table: equal GPU time with
unequal latency puts a difference on the host, unequal GPU time on the kernels.

    python -m benchmarks.probes.repeatability --model resnet50 --batches 8 --repeats 3 --fresh-cache \\
        --profile-calls 200

Output: a markdown table and a JSON file (benchmarks/results/local/ unless `--out` names one).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import common

JIT = "aitune-jit"


def run_order(contenders: list[str], round_index: int) -> list[str]:
    """The contenders of one round: as given on even rounds, reversed on odd ones."""
    return list(contenders) if round_index % 2 == 0 else list(reversed(contenders))


def summarize_runs(medians: list[float]) -> dict[str, float]:
    """Median of the per-process medians, and their spread (max - min) relative to it."""
    middle = statistics.median(medians)
    return {"median_of_medians_ms": middle, "min_ms": min(medians), "max_ms": max(medians),
            "spread": (max(medians) - min(medians)) / middle if middle else float("nan")}


def paired_ratios(jit: list[float | None], other: list[float | None]) -> list[float]:
    """Per round, the comparator's median over the JIT's: throughput of the JIT relative to it (>1: faster)."""
    return [o / j for j, o in zip(jit, other) if j and o]


def cache_folder(scratch: Path, fresh: bool, run_label: str) -> Path:
    """The Inductor cache of one workload process: shared by all, or (fresh) an empty one of its own."""
    if not fresh:
        return scratch / "cache"
    return scratch / "caches" / common.slug(run_label)


def measure(args: argparse.Namespace, scratch: Path) -> list[dict[str, Any]]:
    """Every round of every case; the workloads' logs and their shared Inductor cache go under `scratch`."""
    from benchmarks.suite import contenders as C

    settings = C.Settings(device=args.device, precision=args.precision, iters=args.iters,
                          min_timed_s=args.min_timed_s, work_dir=scratch / "work", profile_calls=args.profile_calls)
    rows = []
    for batch in args.batches:
        case = C.make_case(args.model, batch, settings)
        runs: dict[str, list[dict[str, Any]]] = {c: [] for c in args.contenders}
        for round_index in range(args.repeats):
            for contender in run_order(args.contenders, round_index):
                tag = f"r{round_index}"
                cache = cache_folder(scratch, args.fresh_cache, f"b{batch}-{tag}-{contender}")
                row = C.run_workload(case, settings, contender, jit=contender == JIT, cache_dir=cache,
                                     timeout_s=args.timeout_s, tag=tag)
                runs[contender].append(row)
                print(f"  {args.model} b{batch} round {round_index + 1}/{args.repeats} {contender}: "
                      f"{row.get('median_ms') or row.get('reason')}", flush=True)
        rows.append(_case_row(args, batch, runs))
        del case
        C.free_memory()
    return rows


def _case_row(args: argparse.Namespace, batch: int, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    medians = {c: [r.get("median_ms") if r.get("status") == "ok" else None for r in rs] for c, rs in runs.items()}
    row: dict[str, Any] = {"model": args.model, "batch": batch, "precision": args.precision, "contenders": {}}
    for contender, values in medians.items():
        ok = [v for v in values if v]
        row["contenders"][contender] = {
            "medians_ms": values,
            **(summarize_runs(ok) if ok else {}),
            "max_rel_err": max((r.get("rel_err") or 0.0 for r in runs[contender]), default=None),
            "failures": [r.get("reason") for r in runs[contender] if r.get("status") != "ok"],
            "chunk_medians_ms": [r.get("timed_chunk_medians_ms", []) for r in runs[contender]],
            "profile_per_call_ms": [r.get("profile_per_call_ms") for r in runs[contender]],
            "profiles": [r.get("profile") for r in runs[contender]],
        }
        if contender != JIT and JIT in medians:
            row["contenders"][contender]["jit_ratios"] = paired_ratios(medians[JIT], values)
    return row


def _per_call(profiles: list[dict[str, float] | None], key: str) -> str:
    return ", ".join(f"{p[key]:.3f}" if p and key in p else "-" for p in profiles)


def table(rows: list[dict[str, Any]]) -> str:
    """One line per contender and case; with profiles, each process's profiled GPU and host ms per call."""
    profiled = any(any(c.get("profile_per_call_ms") or []) for row in rows for c in row["contenders"].values())
    head = "| model | batch | contender | per-process medians ms | median | spread | JIT x this, per round |"
    rule = "|---|---|---|---|---|---|---|"
    if profiled:
        head, rule = head + " profiled GPU ms/call | profiled host ms/call |", rule + "---|---|"
    lines = [head, rule]
    for row in rows:
        for contender, c in row["contenders"].items():
            medians = ", ".join("failed" if v is None else f"{v:.3f}" for v in c["medians_ms"])
            ratios = ", ".join(f"{r:.2f}" for r in c.get("jit_ratios", []))
            middle = f"{c['median_of_medians_ms']:.3f}" if "median_of_medians_ms" in c else "-"
            spread = f"{100 * c['spread']:.0f}%" if "spread" in c else "-"
            line = f"| {row['model']} | {row['batch']} | {contender} | {medians} | {middle} | {spread} | {ratios} |"
            if profiled:
                per_call = c.get("profile_per_call_ms") or []
                line += f" {_per_call(per_call, 'cuda_ms')} | {_per_call(per_call, 'cpu_ms')} |"
            lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = common.case_options(common.parser(__doc__), model="resnet50", batches=[1, 8])
    parser.add_argument("--contenders", nargs="+", default=[JIT, "compile:reduce-overhead (workload)"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--min-timed-s", type=float, default=2.0, help="time calls for at least this long")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="per workload process")
    parser.add_argument("--device", default=None)
    parser.add_argument("--fresh-cache", action="store_true",
                        help="an empty Inductor cache for every process (default: one shared by all)")
    parser.add_argument("--profile-calls", type=int, default=0,
                        help="every process profiles this many more calls: GPU and host time per call")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    bad = [c for c in args.contenders if c != JIT and not (c.startswith(("compile:", "eager")) and
                                                           c.endswith(" (workload)"))]
    if bad:
        parser.error(f"workload contenders only (aitune-jit, eager (workload), compile:<mode> (workload)): {bad}")

    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    header = common.environment("repeatability", args.device, args.git_commit)
    with tempfile.TemporaryDirectory(prefix="aitune-repeat-") as scratch:  # Inductor caches can be large
        rows = measure(args, Path(scratch))
    print()
    print(table(rows))
    path = common.result_path(header, args.model, args.precision, out=args.out)
    common.write_result(path, {**header, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
