"""`make demo`: JIT-tune an unmodified inference script with one environment variable.

    python examples/jit_demo.py

Runs examples/resnet_app.py (a small ResNet serving requests; no aitune code in it) in two processes:

1. as is (eager PyTorch);
2. with `AUTOWRAPT_BOOTSTRAP=aitune_enable_jit_tuning` (and `AITUNE_JIT_PRINT_HIERARCHY=1` to see the
   hierarchy at exit): autowrapt switches JIT tuning on when the script imports torch, the first requests
   are recorded, the root module is tuned (Torch Inductor on the CPU, kept only if it measured faster than
   eager) and its subtree detached.

Both processes warm up first (the JIT one tunes), then serve the measured requests in alternating chunks
(`--lockstep`: eager chunk, JIT chunk, JIT chunk, eager chunk, ...), so both see the same machine load; the
comparison printed is the median of the per-round ratios of median latencies, next to each side's overall
median. Both run with `OMP_NUM_THREADS` pinned (1 unless set). Then the outputs of the measured requests (same
inputs in both runs) are compared. Takes about a minute on a 2-core CPU (one Inductor compile).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from aitune_core.validation.tolerance import default_tolerance

HERE = Path(__file__).resolve().parent
APP = HERE / "resnet_app.py"


class App:
    """One run of the app in lockstep mode: started, waited for until READY, then driven chunk by chunk."""

    def __init__(self, label: str, out: Path, env_extra: dict[str, str], app_args: list[str]) -> None:
        env = {k: v for k, v in os.environ.items() if k != "AUTOWRAPT_BOOTSTRAP"}
        env.update(env_extra)
        command = [sys.executable, str(APP), "--out", str(out), "--lockstep", *app_args]
        app = str(APP.relative_to(HERE.parent))
        shown = " ".join([*(f"{k}={v}" for k, v in env_extra.items()), "python", app, "--out", out.name, *app_args])
        print(f"[{label}] $ {shown}", flush=True)
        self.label = label
        self.start = time.perf_counter()
        self.process = subprocess.Popen(
            command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._until("READY")
        tuning = " (JIT tuning included)" if "AUTOWRAPT_BOOTSTRAP" in env_extra else ""
        print(f"[{label}] warmed up in {time.perf_counter() - self.start:.1f}s{tuning}", flush=True)

    def _until(self, word: str) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.strip() == word:
                return
            print(f"[{self.label}] {line}", end="", flush=True)
        raise RuntimeError(f"{self.label}: the app ended before {word}")

    def serve(self, count: int) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(f"GO {count}\n")
        self.process.stdin.flush()
        self._until("DONE")

    def finish(self) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.close()
        for line in self.process.stdout:
            print(f"[{self.label}] {line}", end="", flush=True)
        if self.process.wait() != 0:
            raise RuntimeError(f"{self.label}: the app failed (exit code {self.process.returncode})")


def lockstep(eager: App, jit: App, requests: int, chunk: int) -> int:
    """Serve `requests` in alternating chunks (the order flips every round); returns the number of rounds."""
    rounds = 0
    for first in range(0, requests, chunk):
        count = min(chunk, requests - first)
        order = (eager, jit) if rounds % 2 == 0 else (jit, eager)
        for app in order:
            app.serve(count)
        rounds += 1
    return rounds


def interleaved_speedup(eager_ms: list[float], jit_ms: list[float], chunk: int) -> float:
    """Median over rounds of (eager round median / JIT round median)."""
    ratios = [
        statistics.median(eager_ms[i : i + chunk]) / statistics.median(jit_ms[i : i + chunk])
        for i in range(0, len(eager_ms), chunk)
    ]
    return statistics.median(ratios)


def main() -> int:
    parser = argparse.ArgumentParser(description="JIT-tune an unmodified script with one environment variable")
    parser.add_argument("--device", default="cpu", help="passed to the app: cpu (default) or cuda")
    parser.add_argument("--requests", type=int, default=100, help="measured requests per run")
    parser.add_argument("--chunk", type=int, default=10, help="requests per process and round")
    parser.add_argument("--history", action="store_true", help="also print the JIT tuning history at exit")
    options = parser.parse_args()
    app_args = ["--device", options.device, "--requests", str(options.requests)]
    threads = os.environ.get("OMP_NUM_THREADS", "1")
    print("aitune JIT demo: the same unmodified script, eager and JIT-tuned\n", flush=True)
    with tempfile.TemporaryDirectory(prefix="aitune-demo-") as tmp:
        tmp_dir = Path(tmp)
        eager_out, jit_out = tmp_dir / "eager.pt", tmp_dir / "jit.pt"
        eager_app = App("eager", eager_out, {"OMP_NUM_THREADS": threads}, app_args)
        jit_env = {
            "OMP_NUM_THREADS": threads,
            "AUTOWRAPT_BOOTSTRAP": "aitune_enable_jit_tuning",
            "AITUNE_JIT_PRINT_HIERARCHY": "1",
            "AITUNE_JIT_CACHE_DIR": str(tmp_dir / "jit-cache"),
            # by default tuning runs on a background thread while requests are answered eagerly; the demo tunes
            # during the warm-up requests instead, so that every measured request is a tuned one
            "AITUNE_JIT_BLOCKING": "1",
        }
        if options.history:
            jit_env["AITUNE_JIT_PRINT_HISTORY"] = "1"
        try:
            jit_app = App("jit", jit_out, jit_env, app_args)
            print(f"\nserving {options.requests} requests in each, alternating chunks of {options.chunk}", flush=True)
            rounds = lockstep(eager_app, jit_app, options.requests, options.chunk)
            jit_app.finish()
        finally:
            eager_app.finish()
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
    eager_ms = statistics.median(eager["latencies_ms"])
    jit_ms = statistics.median(tuned["latencies_ms"])
    speedup = interleaved_speedup(eager["latencies_ms"], tuned["latencies_ms"], options.chunk)

    print("\nResult")
    print(f"  outputs of {len(eager['outputs'])} requests: max |JIT - eager| = {max_diff:.2e} "
          f"-> {f'match ({tolerance})' if matches else 'MISMATCH'}")
    print(f"  median latency at batch 4: eager {eager_ms:.2f} ms, JIT {jit_ms:.2f} ms "
          f"(interleaved, {rounds} rounds of {options.chunk} requests each)")
    print(f"  JIT speed-up: {speedup:.2f}x (median of the per-round ratios)")
    print(f"  device: {tuned['device']}; torch {torch.__version__}, {os.cpu_count()} CPU(s), "
          f"OMP_NUM_THREADS={threads}")
    return 0 if matches else 1


if __name__ == "__main__":
    raise SystemExit(main())
