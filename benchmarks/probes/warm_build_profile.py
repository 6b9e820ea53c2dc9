"""Where a warm start's time goes: the JIT's reuse of a cached decision against torch.compile's warm first call.

A second process with a warm JIT cache reuses the decision but still builds the decided backend: a dynamo trace,
Inductor's cache lookups, the warm-up calls (CUDA-graph recording for `reduce-overhead`), the validation. This
probe runs each side in fresh processes, in blocking mode with nothing served (no step-aside gate, no other
thread), and profiles the call that builds with `cProfile`:

- `jit-fill` then `jit-warm`: the model under `import aitune.torch.jit.enable` with `jit_config.blocking`, called
  `min_samples` times at one batch size; the last call tunes (fill) or reuses the decision (warm), profiled;
- `compile-fill` then `compile-warm` per mode: `torch.compile(model, mode=...)` and its first call, profiled.

The JIT processes share one JIT cache; each contender and mode has an Inductor cache folder of its own
(`TORCHINDUCTOR_CACHE_DIR`; `--shared-inductor-cache` for one), so each fill is a cold compile.
Reported: the profiled call's wall time, the JIT's own log of the build, and the functions with the largest
cumulative and own times.

    python -m benchmarks.probes.warm_build_profile --device cuda --model resnet50 --batch 32
    python -m benchmarks.probes.warm_build_profile --device cpu --model tiny_resnet --batch 8 --modes default
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import common

MARK = "WARM_BUILD_PROFILE "
TOP = 45


def _inputs(model_name: str, batch: int, device: Any) -> tuple[Any, Any]:
    """The model (eval, on `device`) and a call of it: `call()` runs one batch."""
    from benchmarks.suite import models

    built = models.build(model_name, batch)
    module = built.module.to(device).eval()
    inputs = built.make_inputs(0).to(device)
    return module, lambda target: target(*inputs.args, **inputs.kwargs)


def _profiled(fn: Any, dump: str | None = None) -> tuple[float, list[dict[str, Any]], list[dict[str, Any]]]:
    profile = cProfile.Profile()
    begin = time.perf_counter()
    profile.enable()
    try:
        fn()
    finally:
        profile.disable()
    took = time.perf_counter() - begin
    if dump:
        profile.dump_stats(dump)
    stats = pstats.Stats(profile, stream=io.StringIO())
    rows = []
    for (filename, line, name), (calls, _prim, own, cumulative, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = "/".join(Path(filename).parts[-2:]) if filename != "~" else "~"
        rows.append({"function": f"{where}:{line}({name})", "calls": calls, "own_s": round(own, 4),
                     "cumulative_s": round(cumulative, 4)})
    by_cumulative = sorted(rows, key=lambda r: -r["cumulative_s"])[:TOP]
    by_own = sorted(rows, key=lambda r: -r["own_s"])[:TOP]
    return took, by_cumulative, by_own


def child(args: argparse.Namespace) -> int:
    import torch

    device = torch.device(args.device)
    result: dict[str, Any] = {"role": args.role}
    if args.role.startswith("jit"):
        import aitune.torch.jit.enable  # noqa: F401  (the zero-code switch, as a user turns it on)
        from aitune.torch import PatchedModule, jit_config

        jit_config.blocking = True
        module, call = _inputs(args.model, args.batch, device)
        with torch.no_grad():
            for _ in range(jit_config.min_samples - 1):
                call(module)
            took, cumulative, own = _profiled(lambda: call(module), args.dump)
        node = PatchedModule.of(module)
        result.update(state=node.state.value if node is not None else None, history=list(PatchedModule.history))
    else:
        module, call = _inputs(args.model, args.batch, device)
        begin = time.perf_counter()
        compiled = torch.compile(module, mode=None if args.mode == "default" else args.mode)
        result["compile_line_s"] = time.perf_counter() - begin
        with torch.no_grad():
            took, cumulative, own = _profiled(lambda: call(compiled), args.dump)
    if device.type == "cuda":
        torch.cuda.synchronize()
    result.update(call_s=took, by_cumulative=cumulative, by_own=own)
    print(MARK + json.dumps(result), flush=True)
    return 0


def _run(role: str, mode: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    inductor = folder / ("inductor" if args.shared_inductor_cache else f"inductor-{role.split('-')[0]}-{mode}")
    env = {**os.environ, "AITUNE_JIT_CACHE_DIR": str(folder / "jit"),
           "TORCHINDUCTOR_CACHE_DIR": str(inductor), "PYTHONUNBUFFERED": "1"}
    for name in ("AUTOWRAPT_BOOTSTRAP", "AITUNE_JIT_BLOCKING"):
        env.pop(name, None)
    command = [sys.executable, "-m", "benchmarks.probes.warm_build_profile", "--child", "--role", role, "--mode", mode,
               "--model", args.model, "--batch", str(args.batch), "--device", args.device]
    if args.pstats_dir is not None:
        args.pstats_dir.mkdir(parents=True, exist_ok=True)
        command += ["--dump", str(args.pstats_dir / f"{args.model}-{role}-{mode}.prof")]
    begin = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout_s, cwd=common.REPO)
    wall = time.perf_counter() - begin
    for line in done.stdout.splitlines():
        if line.startswith(MARK):
            return {"mode": mode, "process_s": wall, **json.loads(line[len(MARK):])}
    return {"role": role, "mode": mode, "error": (done.stderr or done.stdout)[-3000:], "exit_status": done.returncode}


def _print(runs: list[dict[str, Any]], header: dict[str, Any], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"{args.model} batch {args.batch}: the call that builds (s), {header['device']['name']}")
    for column in ("process", "mode", "call (s)", "compile line (s)", "notes"):
        table.add_column(column)
    for run in runs:
        notes = run.get("error", "")[-120:] or "; ".join(h[-110:] for h in run.get("history", [])
                                                         if "reused" in h or "Tuning" in h)
        table.add_row(run["role"], run["mode"], f"{run.get('call_s', float('nan')):.2f}",
                      f"{run['compile_line_s']:.2f}" if "compile_line_s" in run else "-", notes)
    console.print(table)
    for run in runs:
        if run["role"].endswith("warm") and "by_cumulative" in run:
            top = Table(title=f"{run['role']} ({run['mode']}): largest cumulative times")
            for column in ("function", "calls", "cumulative (s)", "own (s)"):
                top.add_column(column)
            for row in run["by_cumulative"][:25]:
                top.add_row(row["function"], str(row["calls"]), f"{row['cumulative_s']:.3f}", f"{row['own_s']:.3f}")
            console.print(top)


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--model", default="tiny_resnet")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--modes", nargs="+", default=["reduce-overhead", "default"],
                        help="torch.compile modes to profile beside the JIT")
    parser.add_argument("--timeout-s", type=float, default=900)
    parser.add_argument("--shared-inductor-cache", action="store_true",
                        help="one Inductor cache for every process (default: one per contender and mode, so each "
                             "fill is cold)")
    parser.add_argument("--pstats-dir", type=Path, default=None, help="also write each profile (cProfile) here")
    parser.add_argument("--dump", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="jit", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)

    runs = []
    with tempfile.TemporaryDirectory(prefix="aitune-warm-build-") as folder:
        plan = [("jit-fill", "jit"), ("jit-warm", "jit")]
        for mode in args.modes:
            plan += [("compile-fill", mode), ("compile-warm", mode)]
        for role, mode in plan:
            run = _run(role, mode, args, Path(folder))
            runs.append(run)
            print(f"{role} {mode}: call {run.get('call_s')} error {run.get('error', '')[-300:]}", flush=True)
    header = common.environment("warm_build_profile", args.device, getattr(args, "git_commit", None))
    _print(runs, header, args)
    doc = {**header, "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
           "model": args.model, "runs": runs}
    common.write_result(common.result_path(header, args.model, args.batch, out=args.out), doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
