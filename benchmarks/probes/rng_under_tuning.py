"""Does background tuning move the program's random streams? Seeded draws checked while the JIT tunes beside them.

A program that seeds before each request and samples (`torch.manual_seed(s)`, then `generate(do_sample=True)`,
or a diffusion step's noise) must draw the same numbers with aitune on: the job thread compiles, measures and
validates while the program draws, and anything the job does to a generator (a draw, a reseed, a state put back,
a CUDA graph capture) would change the program's numbers. On an H200, one of 114 seeded GPT-2 `generate()` calls
sampled another token while the JIT tuned in the background, its scores bit-identical to the plain run's up to
that step (`real_workloads-h200-sampling-background-1a2a5e5.json`).

One process under `AUTOWRAPT_BOOTSTRAP=aitune_enable_jit_tuning` (background tuning, a fresh cache folder): before
the model's first call it takes reference draws for `--seeds` seeds, `--steps` steps each (`torch.rand` and
`torch.multinomial` on the device, `torch.rand` on the CPU, Python's `random`); then it serves a GPT-2
(`--layers`, width `--width`, GPT-2's vocabulary by default) the way a sampler calls it: each request seeds, then
makes `--steps` model calls, each followed by one step's draws, compared with the references (one request is a
window of many calls in which anything the job draws shifts the program's stream). A request whose draws differ is
recorded with the time, the step, and the stacks of aitune's threads at that moment (where the job was). It stops
`--after-s` seconds after the model is tuned, or at `--timeout-s`.

    python -m benchmarks.probes.rng_under_tuning --device cuda
    OMP_NUM_THREADS=2 python -m benchmarks.probes.rng_under_tuning --layers 2 --width 64

Results: a table on stdout and a JSON file (benchmarks/results/local/ unless `--out` names one), with the
environment header of benchmarks/common.py.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

import torch

from benchmarks import common

STACK_DEPTH = 14


def _draws(device: torch.device) -> dict[str, Any]:
    """One step's draws, as a sampler makes them (on the device, on the CPU, Python's `random`)."""
    probs = torch.linspace(0.1, 1.0, 64, device=device)
    return {"device_rand": torch.rand(512, device=device).cpu(),
            "device_multinomial": torch.multinomial(probs, 8, replacement=True).cpu(),
            "cpu_rand": torch.rand(64),
            "python_random": [random.random() for _ in range(4)]}


def _seed(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)


def _differs(got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    return [key for key in want if (not torch.equal(got[key], want[key]) if isinstance(want[key], torch.Tensor)
                                    else got[key] != want[key])]


def _aitune_stacks() -> dict[str, list[str]]:
    """The innermost frames of every thread of aitune's (its job and side-job threads) right now."""
    frames = sys._current_frames()
    stacks = {}
    for thread in threading.enumerate():
        if "aitune" in thread.name and thread.ident in frames:
            summary = traceback.extract_stack(frames[thread.ident])[-STACK_DEPTH:]
            stacks[thread.name] = [f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in summary]
    return stacks


def _model(layers: int, width: int, vocab: int, device: torch.device) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=layers, n_embd=width, n_head=max(1, width // 64), vocab_size=vocab, n_positions=128)
    return GPT2LMHeadModel(config).eval().to(device)


def serve(args: argparse.Namespace) -> dict[str, Any]:
    """Requests as `generate(do_sample=True)` makes them: seed, then `--steps` times a model call and a step's draws,
    each compared with the draws of the same seed and step taken before the model was ever called."""
    device = torch.device(args.device)
    references = {}
    for seed in range(args.seeds):
        _seed(seed)
        references[seed] = [_draws(device) for _ in range(args.steps)]
    model = _model(args.layers, args.width, args.vocab, device)
    node_of = sys.modules["aitune_jit.patched_module"].PatchedModule.of if "aitune_jit.patched_module" in sys.modules \
        else None
    ids = torch.Generator().manual_seed(1)
    start = time.monotonic()
    tuned_at: float | None = None
    checks = requests = 0
    mismatches: list[dict[str, Any]] = []
    node = None
    while time.monotonic() - start < args.timeout_s:
        seed = requests % args.seeds
        _seed(seed)
        for step in range(args.steps):
            with torch.no_grad():
                # (no cache: a returned DynamicCache keeps the root eager, and only the root's compile holds the
                # vocabulary's matmul, where Inductor times a padded one on CUDA)
                model(input_ids=torch.randint(0, args.vocab, (1, 8 + step % 3 * 8), generator=ids).to(device),
                      use_cache=False)
            differing = _differs(_draws(device), references[seed][step])
            checks += 1
            if differing:
                mismatches.append({"t_s": round(time.monotonic() - start, 3), "request": requests, "step": step,
                                   "draws": differing,
                                   "stacks": _aitune_stacks() if len(mismatches) < args.keep else {}})
                break  # (the rest of this request's stream is shifted too)
        requests += 1
        node = node_of(model) if node_of is not None else None
        if tuned_at is None and node is not None and node.state.value == "tuned":
            tuned_at = time.monotonic() - start
        if tuned_at is not None and time.monotonic() - start > tuned_at + args.after_s:
            break
        time.sleep(args.interval_ms / 1e3)
    jit = sys.modules.get("aitune_jit")
    return {"aitune_from": os.path.dirname(jit.__file__) if jit is not None else None,
            "requests": requests, "checks": checks, "mismatching_requests": len(mismatches),
            "tuned_after_s": tuned_at, "state_at_end": node.state.value if node is not None else None,
            "mismatches": mismatches[: args.keep]}


def _run(args: argparse.Namespace, cache_dir: str) -> dict[str, Any]:
    env = {**os.environ, "AUTOWRAPT_BOOTSTRAP": "aitune_enable_jit_tuning", "AITUNE_JIT_CACHE_DIR": cache_dir}
    env.pop("AITUNE_JIT_BLOCKING", None)
    command = [sys.executable, "-m", "benchmarks.probes.rng_under_tuning", "--serve", "--device", args.device,
               "--layers", str(args.layers), "--width", str(args.width), "--vocab", str(args.vocab), "--seeds",
               str(args.seeds), "--steps", str(args.steps),
               "--interval-ms", str(args.interval_ms), "--after-s", str(args.after_s), "--timeout-s",
               str(args.timeout_s), "--keep", str(args.keep)]
    done = subprocess.run(command, cwd=common.REPO, env=env, capture_output=True, text=True,
                          timeout=args.timeout_s + 300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("ROW ")]
    if done.returncode != 0 or not lines:
        return {"error": f"exit {done.returncode}: {done.stderr[-1500:]}"}
    return {**json.loads(lines[-1][4:]), "stderr_lines": len(done.stderr.splitlines())}


def main() -> None:
    parser = common.parser(__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=50257,
                        help="GPT-2's: not a multiple of 8, so Inductor times a padded matmul on CUDA (pad_mm)")
    parser.add_argument("--seeds", type=int, default=4, help="requests cycle through this many seeds")
    parser.add_argument("--steps", type=int, default=16, help="model calls (and draws) per request")
    parser.add_argument("--interval-ms", type=float, default=5.0)
    parser.add_argument("--after-s", type=float, default=10.0)
    parser.add_argument("--timeout-s", type=float, default=240.0)
    parser.add_argument("--keep", type=int, default=10, help="mismatches kept with their stacks")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        print("ROW " + json.dumps(serve(args)), flush=True)
        return
    header = common.environment("rng_under_tuning", args.device, args.git_commit)
    with tempfile.TemporaryDirectory(prefix="aitune-rng-") as folder:
        row = _run(args, folder)
    _table(row, header)
    common.write_result(common.result_path(header, f"gpt2-{args.layers}x{args.width}", out=args.out),
                        {**header, "layers": args.layers, "width": args.width, "seeds": args.seeds, "row": row})


def _table(row: dict[str, Any], header: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"seeded draws while the JIT tunes, {header['device']['name']}")
    for column in ("requests", "steps checked", "requests that drew otherwise", "tuned after s", "state at end",
                   "error"):
        table.add_column(column)
    keys = ("requests", "checks", "mismatching_requests", "tuned_after_s", "state_at_end", "error")
    table.add_row(*[str(row.get(key, ""))[-200:] for key in keys])
    Console().print(table)
    for mismatch in row.get("mismatches", [])[:3]:
        Console().print(f"at {mismatch['t_s']} s, request {mismatch['request']} step {mismatch['step']}: "
                        f"{mismatch['draws']}")
        for name, stack in mismatch["stacks"].items():
            Console().print(f"  {name}: " + " <- ".join(reversed(stack[-6:])))


if __name__ == "__main__":
    main()
