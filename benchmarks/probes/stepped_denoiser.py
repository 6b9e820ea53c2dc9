"""A hand-written diffusion loop that passes its step as a Python int: how many compiles, and when is it fast?

`unet(x, t)` with `t` an int from `range(...)` is how many sampling loops outside the diffusers pipelines call a
diffusers `UNet2DModel`. Before free scalars (`aitune_core/specs/free_scalars.py`) the JIT made one graph per step,
and tuned each one (a compile per step); `torch.compile` compiles twice (its second compile makes the int symbolic).

Each contender is a fresh process running `--rounds` sampling rounds of `--steps` steps each (a round: fixed seed,
`x = x - 0.02 * unet(x, t).sample` per step), or fewer when `--until-s` runs out first:

- `eager`: the plain model;
- `jit`: the unmodified loop under `AUTOWRAPT_BOOTSTRAP=aitune_enable_jit_tuning` (background tuning, default
  configuration, a fresh cache folder);
- `jit-base`: the same with another tree's `src/` first on `PYTHONPATH` (`--base DIR`, e.g. the tree before free
  scalars: `git archive bb8fb31 src | tar -x -C .ab/base`);
- `compile`: `torch.compile(unet)` (default mode).

Per contender: the first round's wall time, the median round of the last half, the round in which the UNet was
first tuned (JIT), how many graphs its node recorded, dynamo's compiled graphs in the process
(`counters["stats"]["unique_graphs"]`, the worker's compiles included), and the largest error of the last round's
steps against the plain UNet on the same inputs (relative to the largest plain value), and the JIT's history
lines saying its job ran without stepping aside because the loop left no gap (`aitune_jit/program_gaps.py`), and
how many such free runs began (`worker_yield.free_runs()`, also while a job is still running at the end).
With `--profile-rounds N`, N more rounds run under `torch.profiler` after the timed ones (`round_profile.py`:
host and device time per round, the runtime calls per UNet call that can make the host wait for the device, the
costliest host ops and kernels); with `AITUNE_JIT_BLOCKING=1` the JIT's profiled rounds are tuned ones.

    python -m benchmarks.probes.stepped_denoiser --device cuda
    OMP_NUM_THREADS=2 python -m benchmarks.probes.stepped_denoiser --base .ab/base

Results: a table on stdout and a JSON file (benchmarks/results/local/ unless `--out` names one), with the
environment header of benchmarks/common.py and the `AITUNE_*` variables the contenders ran under (e.g.
`AITUNE_WORKER_YIELD_MS=0`: the background job does not step aside).
"""

from __future__ import annotations

import argparse
import contextlib
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
from benchmarks.probes import round_profile

CONTENDERS = ("eager", "jit", "jit-base", "compile")


def build(device: torch.device) -> torch.nn.Module:
    """A DDPM-style `UNet2DModel`: small on the CPU, CIFAR-sized on a GPU (random weights)."""
    from diffusers import UNet2DModel

    torch.manual_seed(0)
    if device.type == "cuda":
        unet = UNet2DModel(sample_size=32, block_out_channels=(128, 256, 256), layers_per_block=2,
                           down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D"),
                           up_block_types=("UpBlock2D", "AttnUpBlock2D", "UpBlock2D"))
    else:
        unet = UNet2DModel(sample_size=16, block_out_channels=(32, 64), layers_per_block=1, norm_num_groups=8,
                           down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                           up_block_types=("AttnUpBlock2D", "UpBlock2D"))
    return unet.eval().to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _jit_node(unet: torch.nn.Module) -> Any:
    """The JIT's node of `unet` where the bootstrap loaded the JIT (a probe imports no JIT internals itself)."""
    patched = sys.modules.get("aitune_jit.patched_module")
    return patched.PatchedModule.of(unet) if patched is not None else None


def _plain() -> Any:
    runtime = sys.modules.get("aitune_jit.runtime")
    return runtime.bypassed() if runtime is not None else contextlib.nullcontext()


def serve(contender: str, args: argparse.Namespace) -> dict[str, Any]:
    """One contender's rounds in this process (module docstring)."""
    from torch._dynamo.utils import counters

    device = torch.device(args.device)
    unet = build(device)
    runner = torch.compile(unet) if contender == "compile" else unet
    size = unet.config.sample_size
    steps = list(range(999, -1, -(1000 // args.steps)))[: args.steps]
    rounds: list[float] = []
    tuned_round = None
    calls: list[tuple[torch.Tensor, int, torch.Tensor]] = []
    deadline = time.monotonic() + args.until_s

    def run_round(seed: int) -> list[tuple[torch.Tensor, int, torch.Tensor]]:
        generator = torch.Generator().manual_seed(seed)
        x = torch.randn(args.batch, unet.config.in_channels, size, size, generator=generator).to(device)
        done = []
        with torch.no_grad():
            for t in steps:
                out = runner(x, t).sample
                done.append((x, t, out))
                x = x - 0.02 * out
        return done

    while len(rounds) < args.rounds and time.monotonic() < deadline:
        start = time.perf_counter()
        calls = run_round(len(rounds))
        _sync(device)
        rounds.append(time.perf_counter() - start)
        node = _jit_node(unet)
        if tuned_round is None and node is not None and node.state.value == "tuned":
            tuned_round = len(rounds)
    worst = 0.0
    with torch.no_grad(), _plain():
        for x, t, out in calls:
            want = unet(x, t).sample
            worst = max(worst, float((out - want).abs().max() / want.abs().max().clamp_min(1e-12)))
    node = _jit_node(unet)
    recorder = getattr(node, "recorder", None)
    steady = rounds[len(rounds) // 2:]
    profiled = (round_profile.profile_rounds(run_round, args.profile_rounds, len(steps), device)
                if args.profile_rounds else None)
    return {
        "contender": contender,
        "rounds": len(rounds),
        "first_round_s": round(rounds[0], 3),
        "steady_round_ms": round(statistics.median(steady) * 1e3, 2),
        "tuned_in_round": tuned_round,
        "state_at_end": node.state.value if node is not None else None,
        "graphs_recorded": len(recorder.graph_specs) if recorder is not None else None,
        "dynamo_graphs": counters["stats"]["unique_graphs"],
        "max_rel_err_last_round": worst,
        "rounds_ms": [round(r * 1e3, 1) for r in rounds],
        "free_runs_said": [line for line in _history() if "came back to back" in line],
        "free_runs": _free_runs(),
        "state_after_profile": _jit_node(unet).state.value if _jit_node(unet) is not None else None,
        "profile": profiled,
    }


def _free_runs() -> int | None:
    """Free runs the JIT's jobs began in this process (said in the history only when a job ends)."""
    gate = sys.modules.get("aitune_jit.worker_yield")
    return gate.free_runs() if gate is not None else None


def _history() -> list[str]:
    """The JIT's tuning history where the bootstrap loaded the JIT (e.g. the job ran freely: `program_gaps`)."""
    patched = sys.modules.get("aitune_jit.patched_module")
    return list(patched.PatchedModule.history) if patched is not None else []


def _contender(contender: str, args: argparse.Namespace, cache_dir: str) -> dict[str, Any]:
    """Run one contender in a fresh process; its last `ROW` line is its row."""
    env = dict(os.environ)
    env.pop("AUTOWRAPT_BOOTSTRAP", None)
    if contender.startswith("jit"):
        env["AUTOWRAPT_BOOTSTRAP"] = "aitune_enable_jit_tuning"
        env["AITUNE_JIT_CACHE_DIR"] = str(Path(cache_dir) / contender)  # a cold start each
    if contender == "jit-base":
        env["PYTHONPATH"] = os.pathsep.join([str(Path(args.base).resolve() / "src"), str(common.REPO)])
    command = [sys.executable, "-m", "benchmarks.probes.stepped_denoiser", "--serve", contender,
               "--device", args.device, "--rounds", str(args.rounds), "--steps", str(args.steps),
               "--batch", str(args.batch), "--until-s", str(args.until_s),
               "--profile-rounds", str(args.profile_rounds)]
    done = subprocess.run(command, cwd=common.REPO, env=env, capture_output=True, text=True,
                          timeout=args.until_s + 600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("ROW ")]
    if done.returncode != 0 or not lines:
        return {"contender": contender, "error": f"exit {done.returncode}: {done.stderr[-800:]}"}
    return {**json.loads(lines[-1][4:]), "stderr_lines": len(done.stderr.splitlines())}


def _table(rows: list[dict[str, Any]], header: dict[str, Any], steps: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{steps}-step loop, int steps, {header['device']['name']}")
    keys = ("contender", "rounds", "first_round_s", "steady_round_ms", "tuned_in_round", "graphs_recorded",
            "dynamo_graphs", "max_rel_err_last_round", "error")
    for key in keys:
        table.add_column(key.replace("_", " "))
    for row in rows:
        cells = [f"{row[k]:.3g}" if isinstance(row.get(k), float) else str(row.get(k, "")) for k in keys]
        table.add_row(*cells[:-1], cells[-1].strip().splitlines()[-1][-120:] if cells[-1] else "")
    Console(width=200).print(table)


def main() -> None:
    parser = common.parser(__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=None,
                        help="default: eager jit compile, and jit-base with --base")
    parser.add_argument("--base", help="another tree whose src/ the jit-base contender runs")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--until-s", type=float, default=300.0, help="no round starts after this many seconds")
    parser.add_argument("--profile-rounds", type=int, default=0,
                        help="after the timed rounds, profile this many more (torch.profiler: host and device "
                             "time, the calls that wait for the device, the costliest host ops; round_profile.py)")
    parser.add_argument("--serve", choices=CONTENDERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        print("ROW " + json.dumps(serve(args.serve, args)), flush=True)
        return
    contenders = args.contenders or ["eager", "jit", *(["jit-base"] if args.base else []), "compile"]
    if "jit-base" in contenders and not args.base:
        parser.error("the jit-base contender needs --base DIR")
    header = common.environment("stepped_denoiser", args.device, args.git_commit)
    with tempfile.TemporaryDirectory(prefix="aitune-stepped-") as folder:
        rows = [_contender(contender, args, folder) for contender in contenders]
    _table(rows, header, args.steps)
    aitune_env = {name: value for name, value in os.environ.items() if name.startswith("AITUNE_")}
    common.write_result(common.result_path(header, f"{args.steps}steps", out=args.out),
                        {**header, "steps": args.steps, "batch": args.batch, "rounds": args.rounds,
                         "aitune_env": aitune_env, "rows": rows})


if __name__ == "__main__":
    main()
