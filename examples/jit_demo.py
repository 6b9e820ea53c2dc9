"""`make demo`: JIT-tune an unmodified inference script with one environment variable.

    python examples/jit_demo.py

Runs examples/resnet_app.py (a small ResNet serving requests; no aitune code in it) twice in subprocesses:

1. as is (eager PyTorch);
2. with `AUTOWRAPT_BOOTSTRAP=aitune_enable_jit_tuning` (and `AITUNE_JIT_PRINT_HIERARCHY=1` to see the
   hierarchy at exit): autowrapt switches JIT tuning on when the script imports torch, the first requests
   are recorded, the root module is tuned (Torch Inductor on the CPU) and its subtree detached.

Then compares the outputs of the measured requests (same inputs in both runs) and their median latency.
Takes about a minute on a 2-core CPU (one Inductor compile).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from aitune_core.validation.tolerance import default_tolerance

HERE = Path(__file__).resolve().parent
APP = HERE / "resnet_app.py"


def run_app(out: Path, env_extra: dict[str, str], app_args: list[str]) -> float:
    env = {k: v for k, v in os.environ.items() if k != "AUTOWRAPT_BOOTSTRAP"}
    env.update(env_extra)
    command = [sys.executable, str(APP), "--out", str(out), *app_args]
    app = str(APP.relative_to(HERE.parent))
    shown = " ".join([*(f"{k}={v}" for k, v in env_extra.items()), "python", app, "--out", out.name, *app_args])
    print(f"$ {shown}", flush=True)
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, stderr=subprocess.STDOUT)  # hierarchy/summary in order
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description="JIT-tune an unmodified script with one environment variable")
    parser.add_argument("--device", default="cpu", help="passed to the app: cpu (default) or cuda")
    parser.add_argument("--requests", type=int, default=100, help="measured requests per run")
    parser.add_argument("--history", action="store_true", help="also print the JIT tuning history at exit")
    options = parser.parse_args()
    app_args = ["--device", options.device, "--requests", str(options.requests)]
    print("aitune JIT demo: the same unmodified script, eager and JIT-tuned\n", flush=True)
    with tempfile.TemporaryDirectory(prefix="aitune-demo-") as tmp:
        tmp_dir = Path(tmp)
        eager_out, jit_out = tmp_dir / "eager.pt", tmp_dir / "jit.pt"

        print("[1/2] eager", flush=True)
        eager_wall = run_app(eager_out, {}, app_args)
        print(f"      (process took {eager_wall:.1f}s)\n", flush=True)

        print("[2/2] JIT tuning switched on by the environment variable", flush=True)
        jit_env = {
            "AUTOWRAPT_BOOTSTRAP": "aitune_enable_jit_tuning",
            "AITUNE_JIT_PRINT_HIERARCHY": "1",
            "AITUNE_JIT_CACHE_DIR": str(tmp_dir / "jit-cache"),
        }
        if options.history:
            jit_env["AITUNE_JIT_PRINT_HISTORY"] = "1"
        jit_wall = run_app(jit_out, jit_env, app_args)
        print(f"      (process took {jit_wall:.1f}s, tuning included)\n", flush=True)

        eager = torch.load(eager_out)
        tuned = torch.load(jit_out)

    for a, b in zip(eager["inputs"], tuned["inputs"]):
        assert torch.equal(a, b), "the two runs must see the same requests"
    # the tolerance aitune validates backends with (fp32: 1e-3/1e-4 on the CPU, wider where TF32 is on)
    tolerance = default_tolerance(torch.float32, options.device)
    max_diff = max((a - b).abs().max().item() for a, b in zip(eager["outputs"], tuned["outputs"]))
    matches = all(
        torch.allclose(b, a, rtol=tolerance.rtol, atol=tolerance.atol)
        for a, b in zip(eager["outputs"], tuned["outputs"])
    )
    eager_ms = torch.tensor(eager["latencies_ms"]).median().item()
    jit_ms = torch.tensor(tuned["latencies_ms"]).median().item()

    print("Result")
    print(f"  outputs of {len(eager['outputs'])} requests: max |JIT - eager| = {max_diff:.2e} "
          f"-> {f'match ({tolerance})' if matches else 'MISMATCH'}")
    print(f"  median latency at batch 4: eager {eager_ms:.2f} ms, JIT-tuned {jit_ms:.2f} ms "
          f"-> {eager_ms / jit_ms:.2f}x")
    print(f"  device: {tuned['device']}; torch {torch.__version__}, {os.cpu_count()} CPU(s)")
    return 0 if matches else 1


if __name__ == "__main__":
    raise SystemExit(main())
