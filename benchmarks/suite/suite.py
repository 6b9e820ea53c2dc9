"""The suite driver shared by gpu_suite.py and cpu_suite.py: run every contender for every case, save JSON.

The run is contender-major: first eager for every (model, batch) case (in-process; its fp32 outputs are
the correctness references), then each other contender over all cases, in this order: eager (workload),
aitune-jit and compile:default (workload) (subprocesses of the plain workload script), compile:default,
compile:reduce-overhead, compile:max-autotune-no-cudagraphs (in-process, each after torch._dynamo.reset()),
aitune-aot (in-process, on its own copy of the model). A run that meets its budget loses its last columns (the
slowest compiles) rather than whole models.

Caches: the run gets a fresh folder with Inductor (and Triton) caches: one for this process, one for the
eager and JIT workloads and one for the torch.compile workload, so no side compiles with another's
artefacts.

The results JSON (by default a new file in benchmarks/results/local/, named as benchmarks/common.py says; `--out`
to choose) is rewritten after every contender, and mirrored to $OUT when that folder exists, so a run cut short
keeps what it measured. A time budget skips contenders that would not fit, recording
'skipped: time budget'.

This module imports torch only inside `run()`: the caller sets TORCHINDUCTOR_CACHE_DIR first.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import common

ALL_CONTENDERS = (
    "eager", "eager (workload)", "aitune-jit", "compile:default (workload)",
    "compile:default", "compile:reduce-overhead", "compile:max-autotune-no-cudagraphs", "aitune-aot",
)


@dataclasses.dataclass
class SuiteDefaults:
    suite: str  # "gpu" or "cpu"
    device: str
    models: dict[str, list[str]]  # part number (as str) -> model names; "all" -> every model
    batches: list[int]
    warmup: int
    iters: int
    settle: int
    max_warmup_s: float
    budget_s: float
    workload_timeout_s: float
    estimates_s: dict[str, float]  # a contender's expected wall time until one has been measured in this run
    contenders: tuple[str, ...] = ALL_CONTENDERS
    threads: int | None = None  # CPU threads for every contender (None: torch's default)
    min_timed_s: float = 0.0  # timed calls last at least this long (timing.serve_loop)


def build_parser(d: SuiteDefaults, description: str) -> argparse.ArgumentParser:
    p = common.parser(description)
    parts = ", ".join(f"{k}: {' '.join(v)}" for k, v in d.models.items())
    p.add_argument("--part", default="all", choices=["all", *d.models], help=f"model group ({parts}; all: every part)")
    p.add_argument("--models", nargs="+", help="models to run (overrides --part)")
    p.add_argument("--batches", nargs="+", type=int, default=d.batches)
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: every contender under bf16 autocast; the JIT through AITUNE_JIT_PRECISION=bf16")
    p.add_argument("--contenders", nargs="+", choices=ALL_CONTENDERS, default=list(d.contenders), metavar="NAME",
                   help=f"any of: {', '.join(ALL_CONTENDERS)} (eager always runs; default: "
                        f"{', '.join(d.contenders)})")
    p.add_argument("--device", default=d.device)
    p.add_argument("--threads", type=int, default=d.threads,
                   help="intra-op CPU threads (OMP_NUM_THREADS) for every contender and workload"
                        + (f" (default {d.threads})" if d.threads else " (default: torch's)"))
    p.add_argument("--warmup", type=int, default=d.warmup, help="minimum warm-up calls")
    p.add_argument("--iters", type=int, default=d.iters, help="timed calls (the median is reported)")
    p.add_argument("--min-timed-s", type=float, default=d.min_timed_s,
                   help=f"time calls for at least this many seconds (default {d.min_timed_s}; see timing.py)")
    p.add_argument("--settle", type=int, default=d.settle, help="warm-up ends after this many stable calls")
    p.add_argument("--profile-calls", type=int, default=0,
                   help="workload contenders (the JIT's among them) profile this many more calls after serving: "
                        "op tables and per-call host and GPU time in the JSON (default 0: none)")
    p.add_argument("--max-warmup-s", type=float, default=d.max_warmup_s)
    p.add_argument("--budget-s", type=float, default=d.budget_s,
                   help="skip contenders that would not finish within this many seconds of the start")
    p.add_argument("--workload-timeout-s", type=float, default=d.workload_timeout_s)
    p.add_argument("--cache-dir", type=Path,
                   help="folder for this run's Inductor caches (default: a fresh temporary folder, removed at the end)")
    return p


def prepare_env(args: argparse.Namespace) -> tuple[Path, bool]:
    """Before torch is imported: point Inductor (and Triton) at this process's cache, fix the thread count.

    Returns the run's cache folder (the workloads get `<folder>/workloads`, see contenders.workload_env); the
    thread count is inherited by the workload subprocesses, so every contender runs with the same.
    """
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    if args.cache_dir:
        cache, temporary = args.cache_dir.resolve(), False
    else:
        cache, temporary = Path(tempfile.mkdtemp(prefix="aitune-bench-inductor-")), True
    cache.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache / "suite")
    os.environ["TRITON_CACHE_DIR"] = str(cache / "suite" / "triton")
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    return cache, temporary


class Budget:
    def __init__(self, seconds: float, estimates: dict[str, float]) -> None:
        self.start = time.perf_counter()
        self.seconds = seconds
        self.estimates = dict(estimates)
        self.seen: dict[str, float] = {}

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)

    def expect(self, contender: str) -> float:
        return self.seen.get(contender, self.estimates.get(contender, 60.0))

    def fits(self, contender: str) -> bool:
        return self.left() >= self.expect(contender)

    def record(self, contender: str, wall_s: float) -> None:
        self.seen[contender] = max(wall_s, self.seen.get(contender, 0.0))


def run(args: argparse.Namespace, d: SuiteDefaults, cache: Path) -> dict[str, Any]:
    import torch

    from benchmarks.suite import contenders as C
    from benchmarks.suite import models as M
    from benchmarks.suite import report

    if os.environ.get("AUTOWRAPT_BOOTSTRAP"):
        raise SystemExit("unset AUTOWRAPT_BOOTSTRAP: the suite starts the JIT itself, in its own subprocess; "
                         "with it set, this process (the eager and torch.compile contenders) would be tuned too")
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available here: run `python -m benchmarks.suite.cpu_suite` on a CPU machine")

    names = args.models or ([m for group in d.models.values() for m in group] if args.part == "all"
                           else d.models[args.part])
    names = list(dict.fromkeys(names))
    header = common.environment(f"{d.suite}_suite", args.device, args.git_commit)
    dev = header["device"]
    part = "-".join(names) if args.models else f"part{args.part}"
    json_path = common.result_path(header, args.precision, part, out=args.out)
    tag = json_path.stem
    results_dir = json_path.parent
    results_dir.mkdir(parents=True, exist_ok=True)
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") and Path(os.environ["OUT"]).is_dir() else None

    settings = C.Settings(
        device=args.device, precision=args.precision, warmup=args.warmup, iters=args.iters,
        min_timed_s=args.min_timed_s, settle=args.settle, max_warmup_s=args.max_warmup_s, work_dir=results_dir,
        profile_calls=args.profile_calls,
    )
    doc: dict[str, Any] = {
        "schema": report.SCHEMA,
        "suite": d.suite,
        "tag": tag,
        **header,
        "settings": {
            "precision": args.precision, "batches": args.batches, "models": names, "contenders": args.contenders,
            "warmup": args.warmup, "iters": args.iters, "min_timed_s": args.min_timed_s,
            "profile_calls": args.profile_calls,
            "settle": args.settle, "max_warmup_s": args.max_warmup_s,
            "n_inputs": settings.n_inputs, "check_seeds": list(settings.check_seeds),
            "steady_threshold": 1.5, "budget_s": args.budget_s, "inductor_cache": "fresh per run; one for the suite's "
            "process, another for the workload subprocesses (cold first compile for torch.compile and the JIT)",
        },
        "results": [],
        "complete": False,
    }
    budget = Budget(args.budget_s, d.estimates_s)
    jit_reason = C.jit_available() if "aitune-jit" in args.contenders else None

    def save() -> None:
        doc["elapsed_s"] = round(time.perf_counter() - budget.start, 1)
        json_path.write_text(json.dumps(doc, indent=1, default=str))
        if out_dir:
            shutil.copy2(json_path, out_dir / json_path.name)
            for log in results_dir.glob(f"{tag}-*.log"):
                shutil.copy2(log, out_dir / log.name)

    def add(row: dict[str, Any]) -> dict[str, Any]:
        doc["results"].append(row)
        if row.get("wall_s") is not None and row["status"] in ("ok", "failed"):
            budget.record(row["contender"], row["wall_s"])
        line = f"  {row['contender']:<36} {row['status']:<13}"
        if row["status"] == "ok":
            line += (f" median {row['median_ms']:9.3f} ms  first call {row['first_call_s']:7.2f} s  "
                     f"steady after {row['time_to_steady_s']:7.2f} s  rel err {row['rel_err']:.1e}")
        else:
            line += f" {row['reason']}"
        print(line, flush=True)
        save()
        return row

    def over_budget(batch: int, name: str, contender: str) -> bool:
        if budget.fits(contender):
            return False
        add(C.skipped(C.row_template(name, batch, args.precision, contender),
                      f"time budget ({budget.left():.0f} s left of {args.budget_s:.0f}, "
                      f"needs ~{budget.expect(contender):.0f} s)"))
        return True

    print(f"{d.suite} suite: {', '.join(names)} x batch {args.batches} ({args.precision}) on {dev['name']}; "
          f"results -> {json_path}", flush=True)
    # Contender-major: every case's eager first (the references), then each contender over all cases, the
    # cheapest and the JIT first, so a run that meets its budget loses the last columns, not whole models.
    cases: dict[tuple[str, int], Any] = {}
    for name in names:
        for batch in args.batches:
            if over_budget(batch, name, "eager"):
                continue
            try:
                case = C.make_case(name, batch, settings)
            except M.ModelUnavailable as exc:
                add(C.skipped(C.row_template(name, batch, args.precision, "eager"), str(exc)))
                continue
            print(f"[{name} b={batch} {args.precision}] {case.built.source}", flush=True)
            row = add(C.run_eager(case, settings))
            if row["status"] == "ok":
                cases[(name, batch)] = case
    skipped_models = {(r["model"], r["batch"]): r["reason"] for r in doc["results"] if r["status"] != "ok"}

    for contender in [c for c in args.contenders if c != "eager"]:
        print(f"[{contender}] {budget.left():.0f} s of budget left", flush=True)
        for name in names:
            for batch in args.batches:
                case = cases.get((name, batch))
                if case is None:
                    add(C.skipped(C.row_template(name, batch, args.precision, contender),
                                  f"no eager reference ({skipped_models.get((name, batch), 'not run')})"))
                elif contender == "aitune-jit" and jit_reason:
                    add(C.skipped(C.row_template(case, batch, args.precision, contender), jit_reason,
                                  status="not available"))
                elif over_budget(batch, name, contender):
                    continue
                elif contender in ("eager (workload)", "aitune-jit", report.WORKLOAD_COMPILE):
                    timeout = max(30.0, min(args.workload_timeout_s, budget.left() - 10))
                    # torch.compile in a workload gets caches of its own, used as the JIT uses its own
                    # (shared by this contender's cases only): neither starts warm from the other's compiles
                    folder = "workloads-compile" if contender == report.WORKLOAD_COMPILE else "workloads"
                    add(C.run_workload(case, settings, contender, jit=contender == "aitune-jit",
                                       cache_dir=cache / folder, timeout_s=timeout, tag=tag))
                elif contender.startswith("compile:"):
                    add(C.run_compile(case, settings, contender.split(":", 1)[1]))
                elif contender == "aitune-aot":
                    add(C.run_aot(name, batch, settings))
    cases.clear()
    C.free_memory()

    doc["aitune_jit_config"] = _jit_config_repr()
    doc["complete"] = True
    save()
    rows = report.derive(doc["results"])
    print()
    print(report.format_table(rows))
    print(f"\nresults: {json_path}" + (f" (copied to {out_dir})" if out_dir else ""))
    return doc


def _jit_config_repr() -> str | None:
    """The JIT's default configuration as the public API shows it (recorded, not changed)."""
    try:
        from aitune.torch import jit_config
    except Exception as exc:
        return f"unavailable: {type(exc).__name__}: {exc}"
    return repr(jit_config)


def main(d: SuiteDefaults, description: str, argv: list[str] | None = None) -> int:
    args = build_parser(d, description).parse_args(argv)
    cache, temporary = prepare_env(args)
    try:
        run(args, d, cache)
    finally:
        if temporary:
            shutil.rmtree(cache, ignore_errors=True)
    return 0
