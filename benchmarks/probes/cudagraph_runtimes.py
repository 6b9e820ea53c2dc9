"""Which CUDA-graph runtime costs the host least per call: Inductor's CUDA graph trees or its plain cudagraphify?

Profiles of resnet50 and vit_base (`benchmarks.probes.repeatability --profile-calls` on a GPU) showed the JIT and
`torch.compile(mode="reduce-overhead")` running the same compiled graph (same FX graph hash, same kernels, the
same GPU time per call) and their latency at batch 1 and 8 set by host work before the graph launch: dynamo's
guards, the CUDA-graph-tree bookkeeping of `## Call CompiledFxGraph` and `cudaGraphLaunch`. Inductor has a
second CUDA-graph runtime, used when `triton.cudagraph_trees` is off: one graph per compiled graph and input
shape, inputs copied into static buffers, a replay, no tree bookkeeping. This script measures both, called
directly (`torch.compile` of an entry of its own) and through aitune (AOT, one candidate), side by side in one
process, in alternated rounds so that the host's drift hits every row alike:

    python -m benchmarks.probes.cudagraph_runtimes --model resnet50 --batches 1 8 32
    python -m benchmarks.probes.cudagraph_runtimes --model vit_base --batches 8 --precision bf16

Each row gets its own copy of the model (same seed, same weights). The ratio column is the first row's median
over the row's, per round (> 1: faster than the first row, by default torch.compile's reduce-overhead);
`--rows` measures a subset. CUDA only (`--device cpu` smoke-tests the script).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import torch

from benchmarks import common
from benchmarks.suite import contenders as C
from benchmarks.suite import models, timing

#: Inductor options of the plain (tree-less) CUDA-graph runtime; torch.compile takes them instead of a mode.
PLAIN_CUDAGRAPHS = {"triton.cudagraphs": True, "triton.cudagraph_trees": False}
ROWS = ("compile:reduce-overhead", "compile:plain-cudagraphs", "aitune:reduce-overhead", "aitune:plain-cudagraphs")


def compiled_row(module: torch.nn.Module, plain: bool) -> Callable[..., Any]:
    """torch.compile of an entry function of its own (so that rows never share dynamo cache entries)."""
    from aitune_core.backends.isolated_entry import isolated_entry

    entry = isolated_entry(module, f"bench_{'plain' if plain else 'trees'}")
    if plain:
        return torch.compile(entry, options=dict(PLAIN_CUDAGRAPHS))
    return torch.compile(entry, mode="reduce-overhead")


def aitune_row(case: C.Case, plain: bool, precision: str, device: str) -> Callable[..., Any]:
    """The model tuned by aitune AOT with one candidate: Inductor with the given CUDA-graph runtime."""
    import aitune.torch as ait
    from aitune.torch import FirstWinsStrategy
    from aitune.torch.backend import TorchInductorBackend, TorchInductorBackendConfig

    autocast = {"autocast_enabled": True, "autocast_dtype": torch.bfloat16} if precision == "bf16" else {}
    config = (TorchInductorBackendConfig(options=dict(PLAIN_CUDAGRAPHS), **autocast) if plain
              else TorchInductorBackendConfig(mode="reduce-overhead", **autocast))
    name = f"cg-{case.built.name}-b{case.built.batch}-{'plain' if plain else 'trees'}"
    module = ait.Module(case.built.module, name, strategy=FirstWinsStrategy([TorchInductorBackend(config)]))
    dataset = C.aot_sample_dataset(case, range(2), device)
    ait.tune(module, dataset, batch_sizes=[case.built.batch], device=device)
    return module


def round_median_ms(call: Callable[[models.Batch], Any], inputs: list[models.Batch], calls: int, device: str) -> float:
    """Median of `calls` synchronous calls (the suite's timer: CUDA events on a GPU), rotating through the inputs;
    the warm-up already ran, so the serve loop's own warm-up is its minimum of one call."""
    served = timing.serve_loop(call, inputs, device, warmup=1, iters=calls, settle=1)
    return served.stats.median_ms


def measure_case(name: str, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    device = args.device
    settings = C.Settings(device=device, precision=args.precision)
    autocast = "bf16" if args.precision == "bf16" else "none"
    rows = tuple(args.rows)
    calls: dict[str, Callable[[models.Batch], Any]] = {}
    cases = {}
    for row in rows:
        case = cases[row] = C.make_case(name, batch, settings)
        plain = row.endswith("plain-cudagraphs")
        if row.startswith("compile:"):
            calls[row] = models.caller(compiled_row(case.built.module, plain), torch.device(device).type, autocast)
        else:  # aitune applies the autocast itself (precision="bf16" is the backend's, not the caller's)
            calls[row] = models.caller(aitune_row(case, plain, args.precision, device), torch.device(device).type,
                                       "none")
    result: dict[str, Any] = {"model": name, "batch": batch, "precision": args.precision, "rows": {}}
    with torch.no_grad():
        for row, call in calls.items():  # warm-up: compiles, captures
            for _ in range(args.warmup):
                call(cases[row].inputs[0])
        rounds: dict[str, list[float]] = {row: [] for row in rows}
        for r in range(args.rounds):
            for row in (rows if r % 2 == 0 else tuple(reversed(rows))):
                rounds[row].append(round_median_ms(calls[row], cases[row].inputs, args.calls, device))
        for row, call in calls.items():
            case = cases[row]
            outputs = [models.primary_output(call(b)).float().cpu() for b in case.check_inputs]
            errors = [timing.relative_error(o, ref)[0] for o, ref in zip(outputs, case.reference, strict=True)]
            first = rounds[rows[0]]
            result["rows"][row] = {
                "round_medians_ms": rounds[row], "median_ms": statistics.median(rounds[row]),
                "ratios_to_first": [f / m for f, m in zip(first, rounds[row], strict=True)],
                "max_rel_err": max(errors),
            }
    return result


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| model | batch | precision | row | median ms (of round medians) | x first row, per round | "
             "max rel err |", "|---|---|---|---|---|---|---|"]
    for res in results:
        for row, r in res["rows"].items():
            ratios = ", ".join(f"{x:.2f}" for x in r["ratios_to_first"])
            lines.append(f"| {res['model']} | {res['batch']} | {res['precision']} | {row} | {r['median_ms']:.3f} | "
                         f"{ratios} | {r['max_rel_err']:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = common.case_options(common.parser(__doc__), model="resnet50", batches=[1, 8])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=300, help="timed calls per row and round")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS),
                        help="a subset of the rows (the ratios are taken to the first one given)")
    parser.add_argument("--device", default="cuda", help="cuda; cpu only smoke-tests the script (no CUDA graphs)")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error("CUDA graphs need a CUDA device")

    header = common.environment("cudagraph_runtimes", args.device, args.git_commit)
    results = [measure_case(args.model, batch, args) for batch in args.batches]
    print(table(results))
    path = common.result_path(header, args.model, args.precision, out=args.out)
    common.write_result(path, {**header, "rows": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
