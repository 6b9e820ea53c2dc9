"""How often a serving process ends badly when it exits while a background tuning job runs.

The exit cancel (`aitune_jit/job_cancel.py`) runs whenever a program ends with a job still tuning; a crash there
shows only as the process's exit status, after its output was complete. This probe counts them: fresh serving
processes (`background_tuning`'s `--serve` child, the mixed batch 1/32 schedule, each with an empty JIT cache of
its own) that exit `--after` requests after the root was tuned, by which time the batch-32 calls have queued a
re-tune, so each ends while a job runs. Per process: exit status, whether the summary listed a job still tuning
at exit, time to exit, and for a process killed by a signal the first lines of Python's fault handler.

Variants, interleaved round by round, `--parallel` processes at once:

- `gate`: the defaults (on Python 3.12+, the job steps aside through a `sys.monitoring` callback);
- `nogate`: `AITUNE_WORKER_YIELD_MS=0`, the job does not step aside.

    python -m benchmarks.probes.exit_under_tuning --device cpu --model tiny_resnet --rounds 3
    python -m benchmarks.probes.exit_under_tuning --device cuda --model resnet50 --rounds 3 --parallel 4
"""

from __future__ import annotations

import argparse
import concurrent.futures
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.probes import background_tuning

VARIANTS = {"gate": "jit-cold", "nogate": "jit-cold-nostep"}  # background_tuning's contender for each


def one_process(variant: str, model: str, args: argparse.Namespace) -> dict[str, Any]:
    """Serve in one fresh process; what its end looked like."""
    options = argparse.Namespace(device=args.device, requests=args.requests, after=args.after,
                                 interval_ms=args.interval_ms, stall_ms=1e9, packages="off",
                                 timeout_s=args.timeout_s)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="aitune-exit-") as tmp:
        raw = background_tuning._run(VARIANTS[variant], model, "mixed", options, Path(tmp))
    row: dict[str, Any] = {"variant": variant, "wall_s": round(time.perf_counter() - began, 1)}
    if "error" in raw:
        return {**row, "exit_status": None, "error": raw["error"][-1500:]}
    summary = raw.get("summary", [])
    row.update(exit_status=raw["exit_status"], root_state=raw.get("root_state"),
               tuning_at_exit=any("still tuning" in line for line in summary),
               backends=raw.get("backends"))
    if raw["exit_status"] not in (0, None):
        tail = raw.get("stderr_tail", "")
        start = tail.find("Fatal Python error")
        row["fault"] = tail[start:start + 6000] if start >= 0 else tail[-6000:]
    return row


def tally(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per variant: processes, bad exits, exits with a job still tuning."""
    out = []
    for variant in VARIANTS:
        mine = [r for r in rows if r["variant"] == variant]
        if mine:
            out.append({"variant": variant, "processes": len(mine),
                        "bad_exits": sum(r["exit_status"] not in (0,) for r in mine),
                        "signals": sorted({r["exit_status"] for r in mine if (r["exit_status"] or 0) < 0}),
                        "ended_while_tuning": sum(bool(r.get("tuning_at_exit")) for r in mine)})
    return out


def print_table(summary: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="exit with a tuning job running")
    for column in ("variant", "processes", "bad exits", "signals", "ended while tuning"):
        table.add_column(column)
    for s in summary:
        table.add_row(s["variant"], str(s["processes"]), str(s["bad_exits"]), str(s["signals"]),
                      str(s["ended_while_tuning"]))
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--model", default="tiny_resnet", help="a benchmarks.suite model: resnet50, tiny_resnet")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--parallel", type=int, default=1, help="processes at once (each variant's, interleaved)")
    p.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--after", type=int, default=150)
    p.add_argument("--interval-ms", type=float, default=20.0)
    p.add_argument("--timeout-s", type=float, default=900.0)
    args = p.parse_args(argv)
    header = common.environment("exit_under_tuning", args.device, args.git_commit)
    plan = [v for _ in range(args.rounds) for v in args.variants]
    rows: list[dict[str, Any]] = []
    path = common.result_path(header, args.model, out=args.out)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        for row in pool.map(lambda v: one_process(v, args.model, args), plan):
            rows.append(row)
            print(f"{row['variant']}: exit {row['exit_status']} after {row['wall_s']} s"
                  f"{' (a job was still tuning)' if row.get('tuning_at_exit') else ''}", flush=True)
            common.write_result(path, {**header, "args": vars(args), "summary": tally(rows), "processes": rows})
    print_table(tally(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
