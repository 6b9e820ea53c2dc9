"""Replicas that start together with one JIT cache folder: how many of them tune, and when each serves tuned.

    python -m benchmarks.probes.replica_tuning --device cuda --workload resnet50-mixed --replicas 2
    python -m benchmarks.probes.replica_tuning --device cpu --models tiny --workload resnet50-mixed --replicas 2

Each round launches `--replicas` copies of `background_tuning`'s serving script (one request every
`--interval-ms`, under `AUTOWRAPT_BOOTSTRAP=aitune_enable_jit_tuning`) at the same moment, all with one fresh JIT
cache folder (Inductor's caches under it), and waits for all of them:

- `claims`: as shipped (`AITUNE_JIT_WAIT_FOR_REPLICAS` on): the first replica to tune a graph claims it, the others
  serve it eagerly until its decision is stored and then reuse it (`aitune_jit/replica_claims.py`);
- `no-claims`: `AITUNE_JIT_WAIT_FOR_REPLICAS=0`, every replica tunes for itself (the behaviour before claims).

Rounds alternate (`--rounds` pairs). Reported per replica: time to tuned from its first request and from its
launch, whether its history shows a strategy run ("Tuning ... took") or a reused decision, the due p99 of its
requests while tuning ran, the CPU seconds the process used, and its outputs against one eager process's on fixed
inputs; per round, the replicas' summed CPU seconds and the number of processes that ran the strategy.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import common
from benchmarks.probes.background_tuning import WORKLOADS, _history
from benchmarks.probes.background_tuning_report import summarize

MODES = ("claims", "no-claims")


def _command(model: str, schedule: str, args: Any, out: Path, check: Path) -> list[str]:
    return [sys.executable, "-m", "benchmarks.probes.background_tuning", "--serve", "--model", model,
            "--schedule", schedule, "--device", args.device, "--requests", str(args.requests), "--after",
            str(args.after), "--interval-ms", str(args.interval_ms), "--out", str(out), "--check-out", str(check)]


def _env(cache: Path | None, mode: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AITUNE_JIT_", "TORCHINDUCTOR_CACHE_DIR"))}
    env.pop("AUTOWRAPT_BOOTSTRAP", None)
    if cache is not None:
        env.update(AUTOWRAPT_BOOTSTRAP="aitune_enable_jit_tuning", AITUNE_JIT_CACHE_DIR=str(cache),
                   AITUNE_JIT_PRINT_HISTORY="1", AITUNE_JIT_WAIT_FOR_REPLICAS="1" if mode == "claims" else "0")
    return env


def _eager(model: str, schedule: str, args: Any, scratch: Path) -> dict[str, Any]:
    out, check = scratch / "eager.json", scratch / "eager.pt"
    eager_args = argparse_copy(args, requests=args.after + 50)
    subprocess.run(_command(model, schedule, eager_args, out, check), env=_env(None, "eager"), cwd=common.REPO,
                   capture_output=True, text=True, timeout=args.timeout_s, check=True)
    data = json.loads(out.read_text())
    data["checks"] = torch.load(check)
    return data


def argparse_copy(args: Any, **changes: Any) -> Any:
    copy = type(args)(**vars(args))
    for name, value in changes.items():
        setattr(copy, name, value)
    return copy


def _round(mode: str, model: str, schedule: str, args: Any, scratch: Path, eager: dict[str, Any]) -> dict[str, Any]:
    """Launch the replicas together, wait for all; one summary per replica."""
    cache = scratch / f"{mode}-cache"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    launched, procs = time.time(), []
    for index in range(args.replicas):
        out, check = scratch / f"{mode}-{index}.json", scratch / f"{mode}-{index}.pt"
        proc = subprocess.Popen(_command(model, schedule, args, out, check), env=_env(cache, mode), cwd=common.REPO,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        procs.append((proc, out, check))
    replicas = []
    for proc, out, check in procs:
        try:
            _, stderr = proc.communicate(timeout=args.timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            replicas.append({"error": f"no answer within {args.timeout_s:g}s"})
            continue
        if not out.exists():
            replicas.append({"error": stderr[-2000:] or f"exit status {proc.returncode}"})
            continue
        data = json.loads(out.read_text())
        data["launch_to_start_s"] = data["start_wall"] - launched
        data["checks"] = torch.load(check)
        history = _history(stderr, limit=200)
        row = summarize(data, eager)
        row.update(exit_status=proc.returncode, history=history[:30],
                   ran_strategy=any(line.lstrip().startswith("Tuning ") for line in history),
                   reused=any("reused the decision" in line for line in history),
                   waited=any("is tuning it with the same cache folder" in line for line in history))
        for key in ("stalls", "summary", "long_collections"):
            row.pop(key, None)
        replicas.append(row)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"mode": mode, "replicas": replicas, "cpu_s_all_replicas": cpu_s,
            "replicas_that_ran_the_strategy": sum(bool(r.get("ran_strategy")) for r in replicas)}


def _num(row: dict[str, Any], key: str, fmt: str = ".2f") -> str:
    value = row.get(key)
    return format(value, fmt) if value is not None else "-"


def _print(rounds: list[dict[str, Any]]) -> None:
    print(f"{'mode':<10} {'replica':>7} {'tuned at (s)':>12} {'from launch':>11} {'strategy':>8} {'reused':>6} "
          f"{'waited':>6} {'due p99 ms':>10} {'diff':>9}")
    for entry in rounds:
        for index, row in enumerate(entry["replicas"]):
            if "error" in row:
                print(f"{entry['mode']:<10} {index:>7} error: {row['error'][:80]}")
                continue
            print(f"{entry['mode']:<10} {index:>7} {_num(row, 'time_to_tuned_s'):>12} "
                  f"{_num(row, 'launch_to_tuned_s'):>11} {row['ran_strategy']!s:>8} {row['reused']!s:>6} "
                  f"{row['waited']!s:>6} {_num(row, 'due_during_p99_ms', '.1f'):>10} "
                  f"{_num(row, 'max_abs_diff_vs_eager', '.1e'):>9}")
        print(f"{entry['mode']:<10} {'all':>7} CPU {entry['cpu_s_all_replicas']:.1f} s, "
              f"{entry['replicas_that_ran_the_strategy']} process(es) ran the strategy")


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", choices=sorted(WORKLOADS), default="gpu")
    p.add_argument("--workload", default="resnet50-mixed")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1, help="pairs of rounds (claims, no-claims), alternated")
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--after", type=int, default=200, help="requests each replica serves after it is tuned")
    p.add_argument("--interval-ms", type=float, default=20.0)
    p.add_argument("--timeout-s", type=float, default=600.0)
    args = p.parse_args(argv)
    model, schedule = WORKLOADS[args.models][args.workload]
    header = common.environment("replica_tuning", args.device, args.git_commit)
    results: dict[str, Any] = {**header, "workload": args.workload, "replicas": args.replicas,
                               "interval_ms": args.interval_ms, "rounds": []}
    path = common.result_path(header, args.workload, f"x{args.replicas}", out=args.out)
    with tempfile.TemporaryDirectory(prefix="aitune-replicas-") as tmp:
        eager = _eager(model, schedule, args, Path(tmp))
        for number in range(args.rounds):
            for mode in (MODES if number % 2 == 0 else MODES[::-1]):
                scratch = Path(tmp) / f"round-{number}"
                scratch.mkdir(exist_ok=True)
                results["rounds"].append(_round(mode, model, schedule, args, scratch, eager))
                common.write_result(path, results)
    _print(results["rounds"])
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
