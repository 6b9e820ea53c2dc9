"""Real workloads: time to first result and steady-state speed, plain vs JIT (env var) vs torch.compile.

    python benchmarks/real_workloads/speed.py [--workload unet] [--size real] [--compile default reduce-overhead]
        [--git-commit SHA] [--out FILE]

Runs `workload.py WORKLOAD` in fresh processes, one after another in one run: plainly, under
`AUTOWRAPT_BOOTSTRAP=aitune_enable_jit_tuning` (default JIT configuration), and once per `--compile` mode as the
same script with `model.compile(mode=...)` (what a torch.compile user writes). Reported per contender: the time of
the first result (the first image of a denoising loop: its first `denoise_steps` calls; the first `generate` call),
the whole run's wall time, and the steady state: the median call time over the last result (the last image's calls,
the last three generate calls). Ratios are taken against eager and against each compile mode (values > 1: the JIT is
faster). Inductor's caches are not cleared between processes: each contender starts with what the previous ones
left, as a user's second program would, unless `--fresh-cache` gives each an empty one (the first result is then a
cold compile, as in a new deployment). The contenders run one after another, not interleaved: on a shared CPU the
figures move with whatever else runs (a tiny UNet's JIT steady state read 14.6 ms beside other jobs and 5.5 ms
alone); use it on a GPU machine. The result carries device, date, torch version and git commit; it goes to `--out`,
by default a new file under benchmarks/results/.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
SCRIPT = ["-m", "benchmarks.real_workloads.workload"]  # (run from the repository root)
REPO = HERE.parents[1]
RESULTS = HERE.parent / "results"
SIZES = ("real", "tiny")  # workload.py's sizes


def _contender_env(name: str, scratch: Path, cache_dir: Path | None, fresh: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "AUTOWRAPT_BOOTSTRAP" and not k.startswith("AITUNE_JIT_")}
    env["AITUNE_JIT_CACHE_DIR"] = str(scratch / "jit-cache")
    if fresh:  # an empty Inductor cache of its own: the first result is a cold compile, as in a new deployment
        env["TORCHINDUCTOR_CACHE_DIR"] = str(scratch / f"inductor-{re.sub(r'[^a-z0-9]+', '-', name)}")
    elif cache_dir is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    if name == "aitune-jit":
        env["AUTOWRAPT_BOOTSTRAP"] = "aitune_enable_jit_tuning"
    return env


def _run(name: str, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    out = scratch / f"{name}.pt"
    command = [sys.executable, *SCRIPT, args.workload, "--out", str(out), "--size", args.size,
               "--device", args.device]
    if name.startswith("compile:"):
        command += ["--compile", name.split(":", 1)[1]]
    if args.until_tuned:
        command += ["--until-tuned", str(args.until_tuned)]
    try:
        done = subprocess.run(command, env=_contender_env(name, scratch, args.cache_dir, args.fresh_cache),
                              capture_output=True, text=True, timeout=args.timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return {"contender": name, "returncode": None, "error": f"no result within {args.timeout}s"}
    if done.returncode != 0:
        return {"contender": name, "returncode": done.returncode, "stderr_tail": done.stderr[-3000:]}
    observed = torch.load(out)
    row = {"contender": name, "returncode": 0, **_timings(observed, args)}
    if name == "aitune-jit":  # the exit summary: what was tuned, what stayed eager, which blocks reused a decision
        row["aitune_summary"] = [line for line in done.stderr.splitlines() if "aitune" in line or "  " in line][-60:]
    return row


def _timings(observed: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    times = list(observed.get("times") or [])
    per_result = int(observed.get("steps_per_image", 1))
    last = times[-per_result:] if args.workload == "unet" else times[-3:]
    first = sum(times[:per_result])
    # time-to-tuned: the JIT's worker went idle (background mode) or, for everything else, the first result
    row = {"first_result_s": first, "wall_s": observed.get("wall_s"),
           "tuned_after_s": observed.get("tuned_after_s", first),
           "steady_call_ms": 1000 * statistics.median(last) if last else None, "calls": len(times)}
    counts = list(observed.get("new_tokens") or [])
    if counts and last:  # generate may stop early at an EOS token: per generated token is what compares
        per_token = [t / max(1, n) for t, n in zip(last, counts[-len(last):])]
        row["steady_ms_per_token"] = 1000 * statistics.median(per_token)
        row["last_new_tokens"] = counts[-len(last):]
    return row


def _ratios(rows: list[dict[str, Any]]) -> dict[str, Any]:
    by_name = {row["contender"]: row for row in rows if row.get("returncode") == 0}
    jit = by_name.get("aitune-jit")
    if jit is None:
        return {}
    ratios = {}
    for name, row in by_name.items():
        if name == "aitune-jit":
            continue
        steady = "steady_ms_per_token" if "steady_ms_per_token" in row else "steady_call_ms"
        ratios[name] = {"steady_speed_jit_over": row[steady] / jit[steady],
                        "first_result_jit_over": jit["first_result_s"] / row["first_result_s"],
                        "tuned_after_jit_over": jit["tuned_after_s"] / row["tuned_after_s"]}
    return ratios


def _table(rows: list[dict[str, Any]], ratios: dict[str, Any], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("contender", "first result s", "tuned after s", "steady ms/call", "run s", "JIT speed vs it",
                   "JIT first / its", "JIT tuned / its"):
        table.add_column(column)
    for row in rows:
        if row.get("returncode") != 0:
            table.add_row(row["contender"], "failed", "", "", "", "", "", "")
            continue
        ratio = ratios.get(row["contender"], {})
        table.add_row(row["contender"], f"{row['first_result_s']:.2f}", f"{row['tuned_after_s']:.2f}",
                      f"{row['steady_call_ms']:.2f}", f"{row['wall_s']:.1f}",
                      *(f"{ratio[key]:.2f}x" if ratio else "-"
                        for key in ("steady_speed_jit_over", "first_result_jit_over", "tuned_after_jit_over")))
    Console(width=140).print(table)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", default="unet", choices=["unet", "gpt2"])
    parser.add_argument("--size", default="real", choices=SIZES)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile", nargs="*", default=["default"], help="torch.compile modes to compare with")
    parser.add_argument("--cache-dir", type=Path, default=None, help="TORCHINDUCTOR_CACHE_DIR for every contender")
    parser.add_argument("--fresh-cache", action="store_true", help="an empty Inductor cache per contender")
    parser.add_argument("--until-tuned", type=float, default=0.0, metavar="SECONDS",
                        help="each contender keeps going while aitune's background worker is busy, at most this long "
                             "(the steady state is then the tuned one; see workload.py)")
    parser.add_argument("--no-jit", action="store_true", help="eager and torch.compile only (a compile mode added to "
                                                                   "an earlier run's file, with eager as the link)")
    parser.add_argument("--git-commit", default=None)
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    contenders = ["eager", *([] if args.no_jit else ["aitune-jit"]), *(f"compile:{mode}" for mode in args.compile)]
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    now = dt.datetime.now(dt.timezone.utc)
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    out = args.out or RESULTS / f"real_workloads_speed-{slug}-{args.workload}-{now:%Y%m%dT%H%M%SZ}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="aitune-speed-") as scratch:
        for name in contenders:  # the file is written after each contender: a run cut short keeps what it measured
            rows.append(_run(name, args, Path(scratch)))
            result = {"benchmark": "real_workloads.speed", "date": now.isoformat(timespec="seconds"),
                      "device": device, "torch": torch.__version__, "git_commit": args.git_commit,
                      "workload": args.workload, "size": args.size, "fresh_cache": args.fresh_cache,
                      "until_tuned_s": args.until_tuned, "rows": rows, "ratios": _ratios(rows)}
            out.write_text(json.dumps(result, indent=1, default=str))
    _table(rows, _ratios(rows), f"{args.workload} ({args.size}) on {device}: JIT vs eager and torch.compile")
    print(f"results written to {out}")
    return 0 if all(row.get("returncode") == 0 for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
