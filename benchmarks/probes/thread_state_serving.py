"""Does a model served under a default device and autocast get tuned in the background, with the same answers?

`torch.set_default_device` and `torch.autocast` hold for the thread that set them only, and aitune tunes on a worker
thread of its own. This probe serves a small hand-written decoder (token and position embeddings, causal attention,
MLP blocks) whose forward makes its own tensor without naming a device - a `torch.full(...).triu(1)` causal mask - as
many hand-written models do, from a script that calls
`torch.set_default_device(device)` first and optionally runs every request inside `torch.autocast`. (Positions come
from the embedding's weight, not `torch.arange(T)`: torch 2.11's own `torch.compile` cannot trace an `arange` under
`set_default_device("cuda")` on an H100 - "Unhandled FakeTensor Device Propagation for aten.embedding" - so such a
model stays eager under aitune as it fails under torch.compile.) Two fresh
processes run the same script: plainly, and under `AUTOWRAPT_BOOTSTRAP=aitune_enable_jit_tuning` (background
tuning). The JIT process serves until aitune's worker has been idle for a whole cycle of request lengths (at most
`--serve-s`), then serves one more cycle; every request's output is compared with the plain process's output for
the same request (same seeds), by aitune's own rule for the output's dtype (`--autocast`: that dtype's tolerance).

    python -m benchmarks.probes.thread_state_serving --device cuda [--autocast bf16] [--serve-s 240]
    python -m benchmarks.probes.thread_state_serving --device cpu --serve-s 60   # the CPU has no other device
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import common

LENGTHS = (16, 24, 32, 40)
AUTOCAST = {"bf16": "bfloat16", "fp16": "float16"}


def _model() -> Any:
    import torch

    class Decoder(torch.nn.Module):
        def __init__(self, vocab: int = 1024, width: int = 256, blocks: int = 4, heads: int = 4) -> None:
            super().__init__()
            self.heads = heads
            self.tokens = torch.nn.Embedding(vocab, width)
            self.positions = torch.nn.Embedding(128, width)
            self.qkv = torch.nn.ModuleList(torch.nn.Linear(width, 3 * width) for _ in range(blocks))
            self.mlp = torch.nn.ModuleList(
                torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(),
                                    torch.nn.Linear(4 * width, width))
                for _ in range(blocks))
            self.norm = torch.nn.LayerNorm(width)
            self.head = torch.nn.Linear(width, vocab)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            batch, length = ids.shape
            mask = torch.full((length, length), float("-inf")).triu(1)  # on the default device the script set
            h = self.tokens(ids) + self.positions.weight[:length]
            for qkv, mlp in zip(self.qkv, self.mlp):
                q, k, v = qkv(h).view(batch, length, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
                attended = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype))
                h = h + attended.transpose(1, 2).reshape(batch, length, -1)
                h = h + mlp(h)
            return self.head(self.norm(h))

    return Decoder().eval()


def serve(out: Path, device: str, autocast: str | None, serve_s: float) -> None:
    """The served script: default device first, then requests until the worker is idle (plain: one cycle)."""
    import torch

    torch.manual_seed(0)
    torch.set_default_device(device)
    model = _model()
    worker = sys.modules.get("aitune_jit.worker")  # loaded by the env var only; this script imports no aitune
    outputs, start, request = [], time.perf_counter(), 0
    idle_cycles = 0
    cast = getattr(torch, AUTOCAST[autocast]) if autocast else None
    with torch.no_grad():
        while True:
            length = LENGTHS[request % len(LENGTHS)]
            ids = torch.randint(0, 1024, (4, length), generator=torch.Generator().manual_seed(request % len(LENGTHS)),
                                device="cpu")
            with torch.autocast(torch.device(device).type, dtype=cast, enabled=cast is not None):
                outputs.append(model(ids.to(device)).float().cpu())
            request += 1
            if request % len(LENGTHS) == 0:
                busy = worker is not None and bool(worker.pending())
                idle_cycles = 0 if busy else idle_cycles + 1
                if worker is None or idle_cycles >= 2 or time.perf_counter() - start > serve_s:
                    break
            time.sleep(0.005)
    torch.save({"outputs": outputs, "seconds": time.perf_counter() - start}, out)


def _run(role: str, args: argparse.Namespace, scratch: Path) -> tuple[dict[str, Any], str]:
    import torch

    out = scratch / f"{role}.pt"
    env = {k: v for k, v in os.environ.items() if k != "AUTOWRAPT_BOOTSTRAP" and not k.startswith("AITUNE_JIT_")}
    if role == "jit":
        env.update(AUTOWRAPT_BOOTSTRAP="aitune_enable_jit_tuning", AITUNE_JIT_CACHE_DIR=str(scratch / "jit"),
                   AITUNE_JIT_PRINT_HISTORY="1")
    command = [sys.executable, "-m", "benchmarks.probes.thread_state_serving", "--serve", str(out), "--device",
               args.device, "--serve-s", str(args.serve_s)] + (["--autocast", args.autocast] if args.autocast else [])
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.serve_s + 300,
                          cwd=common.REPO)
    if done.returncode != 0:
        raise SystemExit(f"{role} process failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return torch.load(out), done.stderr


def main() -> None:
    parser = common.parser(__doc__)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--autocast", choices=sorted(AUTOCAST), default=None)
    parser.add_argument("--serve-s", type=float, default=240.0)
    parser.add_argument("--serve", type=Path, default=None, help=argparse.SUPPRESS)  # the served script's side
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, args.device, args.autocast, args.serve_s)
        return
    import torch

    from aitune_core.validation.criterion import Criterion, FloatComparison
    from aitune_core.validation.tolerance import default_tolerance

    with tempfile.TemporaryDirectory(prefix="aitune-thread-state-") as scratch:
        plain, _ = _run("plain", args, Path(scratch))
        jit, stderr = _run("jit", args, Path(scratch))
    dtype = getattr(torch, AUTOCAST[args.autocast]) if args.autocast else torch.float32
    tolerance = default_tolerance(dtype, args.device)
    verdicts = []
    for index, got in enumerate(jit["outputs"]):
        want = plain["outputs"][index % len(plain["outputs"])]
        comparison = FloatComparison(tolerance, want.numel())
        comparison.add(got.reshape(-1).double(), want.reshape(-1).double(), 0)
        verdicts.append(comparison.closeness(Criterion()))
    summary = stderr[stderr.find("aitune JIT tuning summary"):].splitlines()[:6]
    tuned = bool(summary) and "0 module(s) tuned" not in summary[0]
    rows = {"requests": len(verdicts), "agree": sum(v.accepted for v in verdicts), "tuned": tuned,
            "jit_seconds": jit["seconds"], "summary": summary,
            "traceback": "Traceback (most recent call last)" in stderr,
            "worst": max((v.summary() for v in verdicts if not v.accepted), default=None)}
    print(f"{rows['agree']}/{rows['requests']} requests agree with plain eager ({tolerance}); tuned: {tuned}; "
          f"JIT process served {rows['jit_seconds']:.1f} s")
    print("\n".join(summary))
    header = common.environment("thread_state_serving", args.device, args.git_commit)
    detail = f"autocast-{args.autocast}" if args.autocast else "fp32"
    common.write_result(common.result_path(header, detail, out=args.out), {**header, "result": rows})


if __name__ == "__main__":
    main()
