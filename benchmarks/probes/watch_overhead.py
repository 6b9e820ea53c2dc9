"""Per-call cost of the change check (`ModuleWatch.stale`) on the dispatch path, CPU.

A tuned module checks, before every dispatched call, that the model did not change since its backends were built
(docs/architecture.md, "Tuned modules follow the model"). This probe measures that check where it runs:

- `stale()` alone: a backend that reads the weights at call time (one epoch comparison) and a backend that baked
  them (the epoch plus one version-counter read per parameter and buffer), on a transformers-sized block;
- a whole `GraphDispatcher` call of a micro module (Linear(8, 8) + ReLU, run by `TorchEagerBackend`) with and
  without a watch: the added time against the dispatch it sits in;
- the same for a module whose forward slices its `ModuleList` (`self.layers[:6]`, as transformers' LLaMA and
  diffusers' mid block do): the slice is a new container, filled with `add_module`. Until the epoch moved only
  for watched trees (`module_epoch.watch_tree`), that moved it on every call, and every call reviewed the tree.

Interleaved rounds (without, with, without, ...), medians over rounds; one thread.

    python -m benchmarks.probes.watch_overhead [--rounds 30] [--iters 20000]
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import common


class _Micro(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class _Flag:
    def __init__(self, bakes: bool) -> None:
        self.bakes_weights = bakes


def _per_call_ns(fn: Any, iters: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(iters):
        fn()
    return (time.perf_counter_ns() - start) / iters


def _rounds(fns: dict[str, Any], rounds: int, iters: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(_per_call_ns(fn, iters))
    return {name: statistics.median(values) for name, values in samples.items()}


class _Sliced(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:6]:
            x = layer(x)
        return x


def _dispatch_pair(module: torch.nn.Module, x: torch.Tensor, rounds: int, iters: int) -> dict[str, float]:
    """A module's `GraphDispatcher` call (`TorchEagerBackend`) without and with a watch, interleaved."""
    from aitune_core.backends.dispatcher import GraphDispatcher
    from aitune_core.backends.module_watch import ModuleWatch
    from aitune_core.backends.torch_eager import TorchEagerBackend
    from aitune_core.recording.graph_recorder import GraphRecorder

    recorder = GraphRecorder(module.forward)
    with torch.no_grad():
        for _ in range(2):
            recorder.record((x,), {}, module(x))
    spec = recorder.graph_specs[0]
    backend = TorchEagerBackend().build(module, spec, recorder.samples(spec), torch.device("cpu"), Path("."))
    plain = GraphDispatcher([(spec, backend)], module.forward, "plain")
    watched = GraphDispatcher([(spec, backend)], module.forward, "watched", watch=ModuleWatch(module, [backend]))
    with torch.no_grad():
        return _rounds({"without watch": lambda: plain(x), "with watch": lambda: watched(x)}, rounds, iters)


def _block() -> torch.nn.Module:
    layers = [torch.nn.Linear(64, 64) for _ in range(6)] + [torch.nn.LayerNorm(64) for _ in range(2)]
    return torch.nn.Sequential(*layers).eval()  # 16 parameters, like one transformer block


def main(argv: list[str] | None = None) -> int:
    from aitune_core.backends.module_watch import ModuleWatch

    parser = common.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--iters", type=int, default=20000)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    block = _block()
    reading, baked = ModuleWatch(block, [_Flag(False)]), ModuleWatch(block, [_Flag(True)])
    stale = _rounds({"reading": reading.stale, "baked": baked.stale}, args.rounds, args.iters)

    x = torch.randn(2, 8)
    dispatch = _dispatch_pair(_Micro().eval(), x, args.rounds, max(1, args.iters // 10))
    sliced = _dispatch_pair(_Sliced().eval(), x, args.rounds, max(1, args.iters // 20))

    header = common.environment("watch_overhead", "cpu", args.git_commit)
    rows = [
        {"case": "stale(), weights read at call time", "ns_per_call": round(stale["reading"], 1)},
        {"case": f"stale(), baked weights ({len(baked._versions)} tensors)", "ns_per_call": round(stale["baked"], 1)},
        {"case": "dispatcher call, micro module, without watch", "ns_per_call": round(dispatch["without watch"], 1)},
        {"case": "dispatcher call, micro module, with watch", "ns_per_call": round(dispatch["with watch"], 1)},
        {"case": "dispatcher call, slicing module, without watch", "ns_per_call": round(sliced["without watch"], 1)},
        {"case": "dispatcher call, slicing module, with watch", "ns_per_call": round(sliced["with watch"], 1)},
    ]
    added = dispatch["with watch"] - dispatch["without watch"]
    doc = {**header, "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
           "rows": rows, "added_ns_per_dispatch": round(added, 1),
           "added_fraction": round(added / dispatch["without watch"], 4),
           "sliced_with_over_without": round(sliced["with watch"] / sliced["without watch"], 4)}
    for row in rows:
        print(f"{row['case']:<55} {row['ns_per_call']:>10.1f} ns")
    print(f"{'added by the watch per dispatched call':<55} {added:>10.1f} ns ({doc['added_fraction']:.1%})")
    print(f"{'slicing module: with watch / without':<55} {doc['sliced_with_over_without']:>10.3f}")
    common.write_result(common.result_path(header, out=args.out), doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
