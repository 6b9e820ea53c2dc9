"""What requests pay after a program changes its tuned model (a cast, a config flag): aitune's JIT vs torch.compile.

A server that switches its model to half precision after start-up (or moves it to another device) changes what a
compiled graph was made for. torch.compile's guards fail and it recompiles inside the next request; the JIT stops
serving the old backend at once, answers with the original module, and tunes the module again in the background
(`aitune_core/backends/module_watch.py`, `NodeTransitions._backends_outdated`).

A program that flips a flag the forward reads (`model.config.output_hidden_states = True`, `vae.enable_tiling()`)
fails dynamo's guards the same way; the JIT's backend then answers with the plain forward (`run_only.py`) and the
graph is tuned again after a few such calls.

Each contender is a fresh process serving one BERT (BERT-base on a GPU with batch 8 of 64 tokens; a 2-layer BERT
on the CPU with batch 2 of 16 tokens; random ids), a request every `--interval-ms`:

- `eager`: the plain model, the same steps (what the change costs without any compiler: a first float16 call
  loads its kernels);
- `jit`: the unmodified loop under `AUTOWRAPT_BOOTSTRAP=aitune_enable_jit_tuning` (background tuning): serves until
  the model is tuned, changes it (`--change dtype`: `model.to(--dtype)`; `--change config`:
  `model.config.output_hidden_states = True`), serves `--after-s` seconds more;
- `compile`: `torch.compile(model)` (default mode), the same steps (its first call compiles).

Per contender: the latency of the first request after the change and of the slowest one, the median of the last
half of the requests after it, the JIT's time from the change until it was tuned again (back to TUNED after it
left it; None: it never left, or never came back within the run: `state_at_end` says whether it was still being
tuned or decided to stay eager, as a float64 BERT on a CPU may), and the largest difference of any answer after
the change from the plain model's answer to the same request.

    python -m benchmarks.probes.structure_change --device cuda --dtype float16
    python -m benchmarks.probes.structure_change --device cuda --change config
    OMP_NUM_THREADS=2 python -m benchmarks.probes.structure_change --after-s 40

Results: a table on stdout and a JSON file (benchmarks/results/local/ unless `--out` names one), with the
environment header of benchmarks/common.py.
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
from typing import Any

import torch

from benchmarks import common

CONTENDERS = ("eager", "jit", "compile")
CHANGES = ("dtype", "config")


def build(device: torch.device) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    if device.type == "cuda":
        config = transformers.BertConfig()  # BERT-base
    else:
        config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=128)
    return transformers.BertModel(config).eval().to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def summarize(before: list[float], after: list[float], errors: list[float], retuned_s: float | None) -> dict[str, Any]:
    """The row of one contender from its request latencies (ms) before and after the cast."""
    steady = after[len(after) // 2:] or after
    return {
        "before_p50_ms": round(statistics.median(before), 3) if before else None,
        "first_after_ms": round(after[0], 3) if after else None,
        "max_after_ms": round(max(after), 3) if after else None,
        "steady_after_p50_ms": round(statistics.median(steady), 3) if steady else None,
        "requests_after": len(after),
        "retuned_after_s": None if retuned_s is None else round(retuned_s, 2),
        "max_abs_err_after": max(errors) if errors else None,
    }


def change(model: torch.nn.Module, how: str, dtype: torch.dtype) -> None:
    """The program's change after tuning (module docstring)."""
    if how == "dtype":
        model.to(dtype)
    else:
        model.config.output_hidden_states = True


def serve(contender: str, device: torch.device, how: str, dtype: torch.dtype, interval_s: float, after_s: float,
          tuned_timeout_s: float) -> dict[str, Any]:
    """One contender's run in this process (see the module docstring)."""
    model = build(device)
    runner = torch.compile(model) if contender == "compile" else model
    node_of, plain = _jit_views() if contender == "jit" else (None, contextlib.nullcontext)
    generator = torch.Generator().manual_seed(1)
    shape = (8, 64) if device.type == "cuda" else (2, 16)  # (on a CPU, calls small enough for Inductor to win)

    def request() -> tuple[float, torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, 1000, shape, generator=generator).to(device)
        start = time.perf_counter()
        with torch.no_grad():
            out = runner(input_ids=ids).last_hidden_state
        _sync(device)
        return (time.perf_counter() - start) * 1e3, ids, out

    before: list[float] = []
    deadline = time.monotonic() + tuned_timeout_s
    while time.monotonic() < deadline:  # until tuned (JIT) or compiled and warm (torch.compile)
        before.append(request()[0])
        if (node_of is None and len(before) >= 20) or (node_of is not None and _tuned(node_of(model))):
            break
        time.sleep(interval_s)
    tuned_before = node_of is None or _tuned(node_of(model))
    change(model, how, dtype)
    cast_at = time.monotonic()
    after: list[float] = []
    errors: list[float] = []
    retuned: float | None = None
    left = False
    while time.monotonic() - cast_at < after_s:
        ms, ids, out = request()
        after.append(ms)
        with torch.no_grad(), plain():
            want = model(input_ids=ids).last_hidden_state
        errors.append(float((out.float() - want.float()).abs().max()))
        if node_of is not None and retuned is None:  # tuned again: back to TUNED after it left it
            if not _tuned(node_of(model)):
                left = True
            elif left:
                retuned = time.monotonic() - cast_at
        time.sleep(interval_s)
    node = node_of(model) if node_of is not None else None
    return {"contender": contender, "tuned_before_cast": tuned_before, **summarize(before, after, errors, retuned),
            "state_at_end": node.state.value if node is not None else None}


def _jit_views() -> tuple[Any, Any]:
    """(node of a module, the context in which a call runs the plain module) of a process under the JIT: read from
    the modules the bootstrap loaded (a probe goes through `aitune.torch`, and imports no JIT internals)."""
    nodes = sys.modules["aitune_jit.patched_module"].PatchedModule
    return nodes.of, sys.modules["aitune_jit.runtime"].bypassed


def _tuned(node: Any) -> bool:
    return node is not None and node.state.value == "tuned"


def _contender(contender: str, args: Any) -> dict[str, Any]:
    """Run one contender in a fresh process; its last stdout line is its row."""
    env = dict(os.environ)
    env.pop("AUTOWRAPT_BOOTSTRAP", None)
    if contender == "jit":
        env["AUTOWRAPT_BOOTSTRAP"] = "aitune_enable_jit_tuning"
        env.setdefault("AITUNE_JIT_CACHE_DIR", args.cache_dir)  # (a fresh folder: a cold start)
    command = [sys.executable, "-m", "benchmarks.probes.structure_change", "--serve", contender, "--device",
               args.device, "--change", args.change, "--dtype", args.dtype, "--interval-ms", str(args.interval_ms),
               "--after-s", str(args.after_s), "--tuned-timeout-s", str(args.tuned_timeout_s)]
    done = subprocess.run(command, cwd=common.REPO, env=env, capture_output=True, text=True,
                          timeout=args.tuned_timeout_s + args.after_s + 300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("ROW ")]
    if done.returncode != 0 or not lines:
        return {"contender": contender, "error": f"exit {done.returncode}: {done.stderr[-800:]}"}
    return {**json.loads(lines[-1][4:]), "stderr_lines": len(done.stderr.splitlines())}


def main() -> None:
    parser = common.parser(__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--change", default="dtype", choices=CHANGES)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float64"))
    parser.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    parser.add_argument("--interval-ms", type=float, default=20.0)
    parser.add_argument("--after-s", type=float, default=60.0)
    parser.add_argument("--tuned-timeout-s", type=float, default=240.0)
    parser.add_argument("--serve", choices=CONTENDERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        row = serve(args.serve, torch.device(args.device), args.change, getattr(torch, args.dtype),
                    args.interval_ms / 1e3, args.after_s, args.tuned_timeout_s)
        print("ROW " + json.dumps(row), flush=True)
        return
    header = common.environment("structure_change", args.device, args.git_commit)
    with tempfile.TemporaryDirectory(prefix="aitune-structure-change-") as folder:
        args.cache_dir = folder
        rows = [_contender(contender, args) for contender in args.contenders]
    what = f"model.to({args.dtype})" if args.change == "dtype" else "config.output_hidden_states = True"
    _table(rows, header, what)
    common.write_result(common.result_path(header, args.change, args.dtype if args.change == "dtype" else None,
                                           out=args.out),
                        {**header, "change": what, "interval_ms": args.interval_ms, "rows": rows})


def _table(rows: list[dict[str, Any]], header: dict[str, Any], what: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"requests after {what}, {header['device']['name']} (ms, s)")
    columns = ("contender", "before p50", "1st after", "max after", "steady p50", "re-tuned after s",
               "max abs err", "error")
    keys = ("contender", "before_p50_ms", "first_after_ms", "max_after_ms", "steady_after_p50_ms", "retuned_after_s",
            "max_abs_err_after", "error")
    for column in columns:
        table.add_column(column)
    for r in rows:
        cells = [f"{r[k]:.3g}" if isinstance(r.get(k), float) else str(r.get(k, "")) for k in keys]
        table.add_row(*cells[:-1], cells[-1].strip().splitlines()[-1][-120:] if cells[-1] else "")
    Console().print(table)


if __name__ == "__main__":
    main()
