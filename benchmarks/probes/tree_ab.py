"""Is a tuned model served as fast by this tree as by an older one? Per-call latency, two source trees side by side.

    git archive 45746b4 src | tar -x -C .ab/base          # the tree to compare with (only its src/ is needed)
    python -m benchmarks.probes.tree_ab --base .ab/base --model resnet50 --batches 1 --device cuda

For each round and each tree (the order flips every round), a fresh process puts that tree's `src/` first on
`PYTHONPATH`, switches JIT tuning on through the public entry point (`import aitune.torch.jit.enable`, blocking
tuning so the steady state is reached in the process), calls the model until every call is answered by a tuned
root, then times `--iters` calls (wall clock, each synchronized: a served request) and reports their median.
The served process imports nothing of aitune but the entry point, so any tree that has it can be measured.
Reported: the median over rounds per tree and the median of the per-round ratios (this tree / base).
`--model gpt2-generate` times a whole greedy `generate()` of a GPT-2 per request instead (`generate_call.py`:
32 decoding steps, each passing a `DynamicCache`), `--batches` then only names the result.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks import common
from benchmarks.probes import generate_call, round_profile


def serve(args: argparse.Namespace) -> int:
    import aitune.torch.jit.enable  # the public zero-code entry point

    device = torch.device(args.device)
    request = _request(args.model, args.batch, device)
    with torch.no_grad():
        for _ in range(args.warmup):  # recording, tuning (blocking), the first tuned calls
            request()
        latencies = []
        for _ in range(args.iters):  # a served request: the call and its result on the device, synchronized
            start = time.perf_counter()
            request()
            if device.type == "cuda":
                torch.cuda.synchronize()
            latencies.append(1e3 * (time.perf_counter() - start))
    profiled = None
    if args.profile_iters:
        steps = generate_call.NEW_TOKENS if args.model == generate_call.NAME else 1
        profiled = round_profile.profile_rounds(lambda _: request(), args.profile_iters, steps, device)
    import aitune

    Path(args.out).write_text(json.dumps({"median_ms": statistics.median(latencies), "aitune": aitune.__file__,
                                          "profile": profiled}))
    return 0


def _request(model: str, batch: int, device: torch.device) -> Callable[[], Any]:
    """One request of `model`: a suite model's call on its batch, or a whole `generate()` (`generate_call.NAME`)."""
    if model == generate_call.NAME:
        return generate_call.build(device)[1]
    from benchmarks.suite import models

    built = models.build(model, batch)
    module = built.module.to(device)
    inputs = built.make_inputs(0).to(device)
    call = models.caller(module, device.type)
    return lambda: call(inputs)


def _one(tree: Path, args: argparse.Namespace, batch: int, scratch: Path) -> dict[str, Any] | None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AITUNE_JIT_")}
    env.update(PYTHONPATH=os.pathsep.join([str(tree.resolve() / "src"), str(common.REPO)]), AITUNE_JIT_BLOCKING="1",
               AITUNE_JIT_CACHE_DIR=str(scratch / tree.name / "jit"))
    out = scratch / "result.json"
    command = [sys.executable, "-m", "benchmarks.probes.tree_ab", "--serve", "--model", args.model, "--device",
               args.device, "--batch", str(batch), "--warmup", str(args.warmup), "--iters", str(args.iters),
               "--out-serve", str(out), "--profile-iters", str(args.profile_iters)]
    result = subprocess.run(command, env=env, cwd=common.REPO, capture_output=True, text=True, timeout=900)
    if result.returncode != 0 or not out.exists():
        print(f"{tree}: exit {result.returncode}: {result.stderr[-800:]}", flush=True)
        return None
    data = json.loads(out.read_text())
    if not Path(data["aitune"]).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"the process ran aitune from {data['aitune']}, not from {tree}")
    return data


def drive(args: argparse.Namespace) -> int:
    import tempfile

    header = common.environment("tree_ab", args.device, args.git_commit)
    trees = {"this": common.REPO, "base": Path(args.base)}
    results = {**header, "model": args.model, "base": str(args.base), "batches": {}}
    for batch in args.batches:
        times: dict[str, list[float]] = {"this": [], "base": []}
        profiles: dict[str, list[dict[str, Any]]] = {"this": [], "base": []}
        ratios = []
        with tempfile.TemporaryDirectory(prefix="aitune-ab-") as tmp:
            for index in range(args.rounds):
                order = ["this", "base"] if index % 2 == 0 else ["base", "this"]
                served = {name: _one(trees[name], args, batch, Path(tmp)) for name in order}
                got = {name: (data["median_ms"] if data else None) for name, data in served.items()}
                for name, data in served.items():
                    if data is not None:
                        times[name].append(data["median_ms"])
                        if data.get("profile"):
                            profiles[name].append(data["profile"])
                if None not in got.values():
                    ratios.append(got["this"] / got["base"])
                print(f"batch {batch} round {index}: {got}", flush=True)
        results["batches"][str(batch)] = {
            "this_ms": times["this"], "base_ms": times["base"], "ratios": ratios, "profiles": profiles,
            "median_ratio_this_over_base": statistics.median(ratios) if ratios else None}
        print(f"batch {batch}: this/base = {results['batches'][str(batch)]['median_ratio_this_over_base']}")
    common.write_result(common.result_path(header, args.model, out=args.out), results)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = common.case_options(common.parser(__doc__.splitlines()[0]), model="resnet50", batches=[1], precision=None)
    p.add_argument("--base", help="a folder holding the other tree's src/")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--warmup", type=int, default=60)
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--profile-iters", type=int, default=0,
                   help="after the timed requests, profile this many more in each process (round_profile.py)")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--out-serve", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        return serve(argparse.Namespace(**{**vars(args), "out": args.out_serve}))
    if not args.base:
        p.error("--base is required")
    return drive(args)


if __name__ == "__main__":
    raise SystemExit(main())
