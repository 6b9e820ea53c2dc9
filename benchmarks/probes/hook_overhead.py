"""Overhead of the JIT hook on eager execution: ~100 small layers on the CPU, hook off vs on (settled).

    python -m benchmarks.probes.hook_overhead [--rounds 40] [--iters 200] [--out FILE]     # make bench-hook

The patched `torch.nn.Module.__call__` runs for every module call. Once every node has settled, modules
that are not tuned should cost one dict lookup more than without the hook. Two settled states are measured,
each against the hook switched off, in interleaved rounds (off, on, off, on, ...) so drifts of the machine
hit both sides alike; the figure is the median over rounds of (time on / time off):

- `eager`: nothing could be tuned (a backend that never builds), so the root, every block and every
  leaf went EAGER or SKIPPED: the non-leaf nodes keep their call-stack entry, the leaves are on the fast
  path. This is the worst settled case.
- `detached`: the root is tuned with `TorchEagerBackend` (runs the original forward), so all 100+
  submodules are DETACHED and still called: the dispatcher plus 100+ fast-path lookups per forward.

Target: ratio <= 1.05 in both. One thread (`torch.set_num_threads(1)`) for stable timings. The results JSON
goes to benchmarks/results/local/ unless `--out` names a file (benchmarks/results/hook_overhead.json is the
committed one that docs/benchmarks.md cites).
"""

from __future__ import annotations

import logging
import statistics
import time

import torch

import aitune.torch.jit as jit
from aitune.torch import PatchedModule, jit_config
from aitune.torch.backend import Backend, TorchEagerBackend
from benchmarks import common

WIDTH = 32
BLOCKS = 20
BATCH = 8


class NeverBuilds(Backend):
    """A backend that fails to build for every module (drives every node to EAGER)."""

    def _build(self, module, graph_spec, data, cache_dir):  # type: ignore[no-untyped-def]
        raise RuntimeError("this backend never builds")

    def _infer(self, *args, **kwargs):  # type: ignore[no-untyped-def]  # pragma: no cover
        raise AssertionError("never built")


class Block(torch.nn.Module):
    """Five modules: the block and four leaves."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(WIDTH, WIDTH)
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.act = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.norm(self.fc1(x))))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(BLOCKS))
        self.head = torch.nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def module_calls(model: torch.nn.Module, x: torch.Tensor) -> int:
    count = 0

    def pre_hook(module: torch.nn.Module, args: object) -> None:
        nonlocal count
        count += 1

    handle = torch.nn.modules.module.register_module_forward_pre_hook(pre_hook)
    try:
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    return count


def time_forward(model: torch.nn.Module, x: torch.Tensor, iters: int) -> float:
    """Seconds per forward, averaged over `iters` calls."""
    with torch.no_grad():
        start = time.perf_counter()
        for _ in range(iters):
            model(x)
        return (time.perf_counter() - start) / iters


def settle(model: torch.nn.Module, scenario: str) -> dict[str, int]:
    """Switch the hook on and call the model until every node has settled on the fast path; returns the
    state counts."""
    jit_config.reset(read_env=False)
    jit_config.min_samples = 2
    jit_config.detect_graph_breaks = False
    jit_config.max_depth_level = 3
    jit_config.blocking = True  # each level tunes within the settling calls (the hook's cost is measured, not tuning)
    if scenario == "eager":
        jit_config.backends = [NeverBuilds()]
    else:
        jit_config.backends = [TorchEagerBackend()]
    jit.enable()
    with torch.no_grad():
        for step in range(12):  # recording and tuning of each level; more than enough to settle
            model(torch.randn(BATCH + step % 2, WIDTH))
    counts: dict[str, int] = {}
    for node in PatchedModule.walk():
        counts[node.state.value] = counts.get(node.state.value, 0) + 1
        if node.state.value in ("init", "recording") or not node.fast:
            raise RuntimeError(f"{node.path} has not settled: {node}")
    return counts


def measure(scenario: str, rounds: int, iters: int) -> dict[str, object]:
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(BATCH, WIDTH)
    calls = module_calls(model, x)
    original = torch.nn.Module.__call__  # before the hook is installed (main() checks that it is not)
    counts = settle(model, scenario)
    patched = torch.nn.Module.__call__
    off: list[float] = []
    on: list[float] = []
    try:
        for call in (original, patched):  # warm-up both
            torch.nn.Module.__call__ = call  # type: ignore[method-assign]
            time_forward(model, x, iters)
        for _ in range(rounds):
            torch.nn.Module.__call__ = original  # type: ignore[method-assign]
            off.append(time_forward(model, x, iters))
            torch.nn.Module.__call__ = patched  # type: ignore[method-assign]
            on.append(time_forward(model, x, iters))
    finally:
        torch.nn.Module.__call__ = patched  # type: ignore[method-assign]
        jit.disable()
    off_ms, on_ms = statistics.median(off) * 1e3, statistics.median(on) * 1e3
    ratio = statistics.median(b / a for a, b in zip(off, on))
    return {
        "scenario": scenario,
        "module_calls_per_forward": calls,
        "node_states": counts,
        "hook_off_ms": round(off_ms, 4),
        "hook_on_ms": round(on_ms, 4),
        "ratio": round(ratio, 4),
        "overhead_per_module_call_ns": round((ratio - 1.0) * off_ms * 1e6 / calls, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--iters", type=int, default=200)
    options = parser.parse_args(argv)
    if jit.is_enabled():
        raise SystemExit("the JIT hook is already on (unset AUTOWRAPT_BOOTSTRAP): this benchmark switches it itself")
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(1)

    results = [measure(scenario, options.rounds, options.iters) for scenario in ("eager", "detached")]

    print(
        f"JIT hook overhead, {BLOCKS * 5 + 2} modules, batch {BATCH}, CPU, 1 thread, "
        f"median of {options.rounds} rounds of {options.iters} forwards"
    )
    header = f"{'settled state':<14}{'calls/fwd':>10}{'hook off ms':>13}{'hook on ms':>12}{'ratio':>8}{'ns/call':>9}"
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r['scenario']:<14}{r['module_calls_per_forward']:>10}{r['hook_off_ms']:>13.3f}"
            f"{r['hook_on_ms']:>12.3f}{r['ratio']:>8.3f}{r['overhead_per_module_call_ns']:>9.0f}"
        )
    worst = max(float(r["ratio"]) for r in results)  # type: ignore[arg-type]
    print(f"ratio (worst settled state): {worst:.3f}  (target <= 1.05) -> {'OK' if worst <= 1.05 else 'ABOVE TARGET'}")

    header = common.environment("hook_overhead", "cpu", options.git_commit)
    payload = {
        **header,
        "model": {"blocks": BLOCKS, "width": WIDTH, "batch": BATCH, "modules": BLOCKS * 5 + 2},
        "rounds": options.rounds,
        "iters_per_round": options.iters,
        "results": results,
        "worst_ratio": worst,
        "target": 1.05,
    }
    common.write_result(common.result_path(header, out=options.out), payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
