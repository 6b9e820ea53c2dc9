"""Real workloads with and without JIT tuning: same answers? Prints a table and writes a JSON result.

    python benchmarks/real_workloads/correctness.py [--workloads gpt2 unet] [--size real] [--device cuda]
        [--precision fp32|bf16] [--autocast bf16|fp16] [--background SECONDS] [--git-commit SHA] [--out FILE]

Each workload (`workload.py`) runs twice in fresh processes: plainly, and as the same unmodified script under
`AUTOWRAPT_BOOTSTRAP=aitune_enable_jit_tuning` (default JIT configuration; `--precision bf16` sets
`AITUNE_JIT_PRECISION=bf16`). Compared per call: generated tokens (identical, or parted at a near tie: the
first differing token was chosen between two scores closer than the tolerance allows, all scores agreeing up to
it, which any kernel that rounds differently causes in reduced precision) and scores; the answers of the
request-serving workloads (embeddings, image classifiers) against the plain run's answer to the same request; UNet
outputs against plain eager run on the JIT run's own inputs (a third process replays them: the denoising trajectories
of two runs drift apart from the first rounding difference, a random-weight UNet under guidance 7.5 amplifying
it, so only same-input comparisons measure a call's error), checked against aitune's tolerance for the device
(fp32 with TF32 allowed on CUDA rtol=1e-2, atol=1e-3; bf16 5e-2) by aitune's own rule (validation/criterion.py:
whole-tensor L2 bound, at most 0.1 % outliers, an error cap); output types; the exit code and ERROR lines of the
tuned run. `--autocast DTYPE` runs every process's workload inside `torch.autocast` (outputs judged with that
dtype's tolerance). `--background S` runs the JIT process with background tuning, as a server would (no
`AITUNE_JIT_BLOCKING`): the script keeps producing results while the worker tunes, at most S seconds
(`workload.py --until-tuned`), and every result of that run - those answered eagerly during tuning and the tuned
ones after - is compared with the plain run's result for the same prompt (generate) or with plain eager on the
same inputs (UNet). With `--log-dir`, each run's output and result file (.pt) are kept there. Wall times of the first
call and of the whole run are reported side by side.
The result file carries device, date, torch version and git commit; it is written to `--out`, by default a new
file under benchmarks/results/ (never an existing one).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from aitune_core.validation.criterion import Closeness, Criterion, FloatComparison
from aitune_core.validation.tolerance import Tolerance

HERE = Path(__file__).resolve().parent
SCRIPT = ["-m", "benchmarks.real_workloads.workload"]  # (run from the repository root)
REPO = HERE.parents[1]
RESULTS = HERE.parent / "results"
TOLERANCE = {"fp32": (1e-2, 1e-3), "bf16": (5e-2, 5e-2), "fp16": (1e-2, 1e-2)}
_ERROR_LINE = re.compile(r"(^|\s)(ERROR|CRITICAL)\b|Traceback \(most recent call last\)", re.MULTILINE)


def _run(
    workload: str, args: argparse.Namespace, jit: bool, scratch: Path, replay: Path | None = None
) -> dict[str, Any]:
    role = "replay" if replay is not None else ("jit" if jit else "plain")
    out = scratch / f"{workload}-{role}.pt"
    env = {k: v for k, v in os.environ.items() if k != "AUTOWRAPT_BOOTSTRAP" and not k.startswith("AITUNE_JIT_")}
    env["AITUNE_JIT_CACHE_DIR"] = str(scratch / "jit-cache")
    command = [sys.executable, *SCRIPT, workload, "--out", str(out), "--size", args.size, "--device", args.device]
    if jit:
        # blocking unless --background: these short scripts must be answered by tuned backends to check them
        env.update(AUTOWRAPT_BOOTSTRAP="aitune_enable_jit_tuning", AITUNE_JIT_PRINT_HISTORY="1")
        if args.background:
            command += ["--until-tuned", str(args.background)]
        else:
            env["AITUNE_JIT_BLOCKING"] = "1"
        if args.precision == "bf16":
            env["AITUNE_JIT_PRECISION"] = "bf16"
    if args.autocast:
        command += ["--autocast", args.autocast]
    if replay is not None:
        command += ["--replay", str(replay)]
    log_dir = args.log_dir or scratch
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{workload}-{role}.stderr.txt"
    with log.open("w") as sink:  # streamed: a run cut short still leaves what it printed
        done = subprocess.run(command, env=env, stdout=sink, stderr=subprocess.STDOUT, text=True, timeout=args.timeout,
                              cwd=REPO)
    stderr = log.read_text(errors="replace")
    result: dict[str, Any] = {
        "returncode": done.returncode,
        "error_lines": [line for line in stderr.splitlines() if _ERROR_LINE.search(line)][:20],
        "stderr_tail": stderr[-3000:] if done.returncode else "",
    }
    if jit:
        history = stderr[stderr.find("JIT Tuning History:") :].splitlines()
        result["history"] = [line for line in history if "aitune JIT tuning summary" not in line][:400]
        result["summary"] = stderr[stderr.find("aitune JIT tuning summary") :].splitlines()[:40]
    if done.returncode == 0:
        result["observed"] = torch.load(out)
        result["path"] = out
        if args.log_dir is not None:
            shutil.copy(out, args.log_dir / out.name)
    return result


def _relative(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    """Max absolute and relative L2 error over the finite entries; entries equal in both (the -inf scores of tokens
    a sampler filtered out) count as no error, an infinity on one side only makes both figures inf."""
    got, want = got.double(), want.double()
    same = got == want
    diff = torch.where(same, 0.0, (got - want).abs()).nan_to_num(nan=float("inf"), posinf=float("inf"))
    scale = torch.where(want.isfinite(), want, 0.0).norm().clamp_min(1e-30)
    return float(diff.max()), float(diff.norm() / scale)


def _closeness(got: torch.Tensor, want: torch.Tensor, precision: str) -> Closeness:
    """aitune's own acceptance rule for a floating output (validation/criterion.py, the README's Tolerances)."""
    rtol, atol = TOLERANCE[precision]
    comparison = FloatComparison(Tolerance(rtol=rtol, atol=atol), want.numel())
    comparison.add(got.reshape(-1).double(), want.reshape(-1).double(), 0)
    return comparison.closeness(Criterion())


def _within(got: torch.Tensor, want: torch.Tensor, precision: str) -> bool:
    return _closeness(got, want, precision).accepted


def _divergence(a: torch.Tensor, b: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
                precision: str) -> dict[str, Any]:
    """Where two greedy generations from one prompt part: the first generated token that differs, the plain run's
    margin between its best and second-best score at that step, and whether every step's scores up to and
    including it agree within `precision`'s tolerance. A `near_tie` is a flip of the argmax between two tokens
    whose scores lie closer than the tolerance allows at that step: any kernel that rounds differently makes it
    in reduced precision (torch.compile too), and from then on the two runs generate from different contexts."""
    n = min(a.shape[-1], b.shape[-1])
    differing = (a.reshape(-1)[:n] != b.reshape(-1)[:n]).nonzero()
    position = int(differing[0]) if len(differing) else n
    step = position - (a.shape[-1] - sa.shape[0])  # the scores row that chose the token at `position`
    if step < 0 or step >= min(sa.shape[0], sb.shape[0]):
        return {"first_differing_step": step, "near_tie": False}
    best, second = sa[step].reshape(-1).double().topk(2).values.tolist()
    rtol, atol = TOLERANCE[precision]
    allowance = atol + rtol * abs(best)
    agreed = _within(sb[: step + 1], sa[: step + 1], precision)
    return {"first_differing_step": step, "plain_margin": best - second, "allowance": allowance,
            "scores_within_tolerance_until_then": agreed, "near_tie": agreed and best - second <= allowance}


def _compare_generate(plain: dict[str, Any], jit: dict[str, Any], precision: str) -> dict[str, Any]:
    """Every JIT result against the plain run's result for the same prompt: the JIT run's call `j` used prompt
    `j % n` of the plain run's `n` (a background run makes more calls while it tunes). A call agrees when its
    tokens are identical and its scores within tolerance, or when the generations part at a near tie
    (`_divergence`)."""
    calls = []
    n = len(plain["tokens"])
    for index, (b, sb) in enumerate(zip(jit["tokens"], jit["scores"])):
        a, sa = plain["tokens"][index % n], plain["scores"][index % n]
        max_abs, rel = _relative(sb, sa) if sa.shape == sb.shape else (float("nan"), float("nan"))
        call = {"call": index, "tokens_identical": bool(torch.equal(a, b)), "scores_max_abs": max_abs,
                "scores_rel": rel, "scores_within_tolerance": sa.shape == sb.shape and _within(sb, sa, precision)}
        if not call["tokens_identical"]:
            call["divergence"] = _divergence(a, b, sa, sb, precision)
        call["agrees"] = (call["tokens_identical"] and call["scores_within_tolerance"]) or bool(
            call.get("divergence", {}).get("near_tie"))
        calls.append(call)
    ok = len(calls) >= n and all(c["agrees"] for c in calls)
    flips = sum(1 for c in calls if c.get("divergence", {}).get("near_tie"))
    return {"ok": ok, "calls": calls, "near_tie_flips": flips}


def _compare_unet(plain: dict[str, Any], jit: dict[str, Any], precision: str,
                  replay: dict[str, Any] | None) -> dict[str, Any]:
    """Per call: the JIT run's output against plain eager on the same inputs (`replay`); the trajectories of the
    two runs (final latents, per-call drift) are reported too, for information."""
    reference = replay["calls"] if replay is not None else plain["calls"]
    calls = []
    first = plain["calls"]
    for index, (a, b) in enumerate(zip(reference, jit["calls"])):
        p = first[index % len(first)]  # (a background run makes more calls than the plain one)
        max_abs, rel = _relative(b["sample"], a["sample"])
        closeness = _closeness(b["sample"], a["sample"], precision)
        drift = _relative(b["sample"], p["sample"])[1] if index < len(first) else None
        calls.append({"call": index, "type_preserved": p["type"] == b["type"] and p["sample_type"] == b["sample_type"],
                      "type": b["type"], "max_abs": max_abs, "rel": rel, "within_tolerance": closeness.accepted,
                      "closeness": closeness.summary(), "trajectory_rel": drift})
    images = [_relative(b, a) for a, b in zip(plain["images"], jit["images"])]
    ok = len(calls) == len(jit["calls"]) >= len(first) and all(c["type_preserved"] and c["within_tolerance"]
                                                                for c in calls)
    return {"ok": ok, "reference": "replay" if replay is not None else "plain run", "calls": calls,
            "images_max_abs_rel": images}


def _compare_outputs(plain: dict[str, Any], jit: dict[str, Any], precision: str) -> dict[str, Any]:
    """Every answer of a request-serving workload against the plain run's answer to the same request (a background
    run serves the request cycle more times while it tunes: its answer `j` is to request `j % n`)."""
    n = plain["requests"]
    calls = []
    for index, got in enumerate(jit["outputs"]):
        want = plain["outputs"][index % n]
        same_shape = got.shape == want.shape
        max_abs, rel = _relative(got, want) if same_shape else (float("nan"), float("nan"))
        closeness = _closeness(got, want, precision) if same_shape else None
        calls.append({"call": index, "max_abs": max_abs, "rel": rel,
                      "within_tolerance": closeness is not None and closeness.accepted,
                      "closeness": closeness.summary() if closeness is not None else "shapes differ"})
    ok = len(calls) >= n and all(c["within_tolerance"] for c in calls)
    return {"ok": ok, "calls": calls}


def compare(workload: str, plain: dict[str, Any], jit: dict[str, Any], precision: str,
            replay: dict[str, Any] | None = None) -> dict[str, Any]:
    if "tokens" in plain:
        return _compare_generate(plain, jit, precision)
    if "outputs" in plain and "requests" in plain:
        return _compare_outputs(plain, jit, precision)
    if isinstance(plain.get("calls"), list):
        return _compare_unet(plain, jit, precision, replay)
    return _compare_whole(plain, jit, precision)


def _leaves(value: Any, path: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        return [leaf for key in sorted(value, key=str) for leaf in _leaves(value[key], f"{path}[{key!r}]")]
    if isinstance(value, (list, tuple)):
        return [leaf for index, item in enumerate(value) for leaf in _leaves(item, f"{path}[{index}]")]
    return [(path, value)]


def _compare_whole(plain: dict[str, Any], jit: dict[str, Any], precision: str) -> dict[str, Any]:
    """Everything else a workload keeps (the outputs and the state of the objects a program owns, the `appending`
    and `dict_mutation` workloads): the same structure, floating tensors within tolerance, everything else equal."""
    skip = {"times", "wall_s"}
    want = _leaves({k: v for k, v in plain.items() if k not in skip})
    got = dict(_leaves({k: v for k, v in jit.items() if k not in skip}))
    calls = []
    for path, value in want:
        other = got.get(path, _MISSING_LEAF)
        if isinstance(value, torch.Tensor) and value.is_floating_point() and isinstance(other, torch.Tensor):
            same_shape = other.shape == value.shape
            max_abs, rel = _relative(other, value) if same_shape else (float("nan"), float("nan"))
            agrees = same_shape and _within(other, value, precision)
        else:
            max_abs = rel = 0.0
            agrees = bool(torch.equal(other, value)) if isinstance(value, torch.Tensor) and isinstance(
                other, torch.Tensor) else other is not _MISSING_LEAF and other == value
        calls.append({"call": path, "max_abs": max_abs, "rel": rel, "agrees": agrees})
    ok = len(got) == len(want) and all(c["agrees"] for c in calls)
    return {"ok": ok, "calls": calls}


_MISSING_LEAF = object()


def _judged_as(args: argparse.Namespace) -> str:
    """The tolerance outputs are judged with: the autocast dtype's when the workload runs under autocast."""
    return args.autocast or args.precision


def _timing(observed: dict[str, Any]) -> dict[str, Any]:
    times = observed.get("times") or []
    return {"first_call_s": times[0] if times else None, "wall_s": observed.get("wall_s"),
            "last_call_s": times[-1] if times else None}


def _device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return "cpu"


def _table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Real workloads: JIT (env var) vs plain, same script")
    for column in ("workload", "same answers", "calls", "worst rel err", "first call plain/JIT s",
                   "run plain/JIT s", "ERROR lines"):
        table.add_column(column)
    for row in rows:
        calls = row.get("comparison", {}).get("calls", [])
        worst = max((c.get("scores_rel", c.get("rel", 0.0)) for c in calls), default=float("nan"))
        plain, jit = row.get("plain_timing", {}), row.get("jit_timing", {})
        flips = row.get("comparison", {}).get("near_tie_flips")
        same = ("yes" if row.get("ok") else "NO") + (f" ({flips} near-tie flips)" if flips else "")
        table.add_row(
            row["workload"], same, str(len(calls)), f"{worst:.2e}",
            f"{plain.get('first_call_s') or 0:.2f} / {jit.get('first_call_s') or 0:.2f}",
            f"{plain.get('wall_s') or 0:.1f} / {jit.get('wall_s') or 0:.1f}", str(len(row.get("error_lines", []))),
        )
    Console(width=140).print(table)


def recompare(result_file: Path, kept: Path, precision: str, git_commit: str | None) -> dict[str, Any]:
    """Judge a finished run again from the result files it kept (`--log-dir`), with this tree's criterion: the rows
    get new comparisons and a `recompared` note (date, commit); nothing else of the run changes."""
    result = json.loads(result_file.read_text())
    for row in result["rows"]:
        files = {role: kept / f"{row['workload']}-{role}.pt" for role in ("plain", "jit", "replay")}
        if not (files["plain"].exists() and files["jit"].exists()):
            continue
        replay = torch.load(files["replay"]) if files["replay"].exists() else None
        row["comparison"] = compare(row["workload"], torch.load(files["plain"]), torch.load(files["jit"]), precision,
                                    replay)
        row["ok"] = bool(row["comparison"]["ok"]) and not row["error_lines"]
    now = dt.datetime.now(dt.timezone.utc)
    result["recompared"] = {"date": now.isoformat(timespec="seconds"), "git_commit": git_commit,
                            "from": str(result_file.name)}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=["gpt2", "unet"])
    parser.add_argument("--size", default="real", choices=["tiny", "real"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", default="fp32", choices=["bf16", "fp32"])
    parser.add_argument("--autocast", default=None, choices=["bf16", "fp16"],
                        help="run every workload inside torch.autocast(device, dtype)")
    parser.add_argument("--background", type=float, default=0.0, metavar="SECONDS",
                        help="tune in the background (no AITUNE_JIT_BLOCKING), producing results for at most this long")
    parser.add_argument("--git-commit", default=None, help="the commit measured (the tree copy may have no .git)")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--log-dir", type=Path, default=None, help="keep each run's output here (default: scratch)")
    parser.add_argument("--recompare", type=Path, default=None,
                        help="judge this finished run's result JSON again from the files kept in --log-dir")
    args = parser.parse_args()
    if args.recompare is not None:
        if args.log_dir is None or args.out is None:
            parser.error("--recompare needs --log-dir (the kept result files) and --out")
        result = recompare(args.recompare, args.log_dir, _judged_as(args), args.git_commit)
        _table(result["rows"])
        args.out.write_text(json.dumps(result, indent=1, default=str))
        print(f"results written to {args.out}")
        return 0 if all(row["ok"] for row in result["rows"]) else 1
    now = dt.datetime.now(dt.timezone.utc)
    device = _device_name(args.device)
    out = _out_path(args, device, now)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="aitune-real-") as scratch:
        for workload in args.workloads:
            rows.append(_row(workload, args, Path(scratch)))
            _write(out, args, device, now, rows, complete=False)  # (a run cut short keeps the rows it finished)
            print(f"{workload}: {'same answers' if rows[-1]['ok'] else 'NOT OK'}", flush=True)
    _table(rows)
    _write(out, args, device, now, rows, complete=True)
    print(f"results written to {out}")
    return 0 if all(row["ok"] for row in rows) else 1


def _row(workload: str, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """One workload plainly and under the JIT, compared."""
    plain = _run(workload, args, False, scratch)
    jit = _run(workload, args, True, scratch)
    row: dict[str, Any] = {"workload": workload, "plain_returncode": plain["returncode"],
                           "jit_returncode": jit["returncode"], "error_lines": jit["error_lines"],
                           "history": jit.get("history", []), "summary": jit.get("summary", []),
                           "stderr_tail": jit["stderr_tail"] or plain["stderr_tail"]}
    if "observed" in plain and "observed" in jit:
        replay = None
        if workload == "unet":  # plain eager on the JIT run's own inputs, call by call
            replay = _run(workload, args, False, scratch, replay=jit["path"]).get("observed")
        row["comparison"] = compare(workload, plain["observed"], jit["observed"], _judged_as(args), replay)
        if args.background:
            row["jit_tuned_after_s"] = jit["observed"].get("tuned_after_s")
        row["plain_timing"], row["jit_timing"] = _timing(plain["observed"]), _timing(jit["observed"])
    row["ok"] = bool(row.get("comparison", {}).get("ok")) and not row["error_lines"]
    return row


def _out_path(args: argparse.Namespace, device: str, now: dt.datetime) -> Path:
    """Where the result goes: `--out`, or a new file named by device, variant and time (never an existing one)."""
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")
    variant = f"{args.precision}{f'-autocast-{args.autocast}' if args.autocast else ''}"
    variant += "-background" if args.background else ""
    out = args.out or RESULTS / f"real_workloads-{slug}-{variant}-{now:%Y%m%dT%H%M%SZ}.json"
    if args.out is None and out.exists():
        raise SystemExit(f"{out} exists; pass --out to choose another file")
    out.parent.mkdir(parents=True, exist_ok=True)
    return out


def _write(out: Path, args: argparse.Namespace, device: str, now: dt.datetime, rows: list[dict[str, Any]],
           complete: bool) -> None:
    result = {"benchmark": "real_workloads.correctness", "date": now.isoformat(timespec="seconds"),
              "device": device, "torch": torch.__version__, "git_commit": args.git_commit, "size": args.size,
              "precision": args.precision, "autocast": args.autocast, "background_s": args.background or None,
              "complete": complete, "workloads": args.workloads, "rows": rows}
    out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    raise SystemExit(main())
