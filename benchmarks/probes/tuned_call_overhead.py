"""Where does a JIT-tuned call spend its time compared with a hand-written `torch.compile`?

Side by side in one process, on the same model copy and inputs:

    eager                         the module as the user wrote it
    compile:<mode>                torch.compile(module, mode=<mode>) called directly
    jit (hook)                    the same module JIT-tuned through the `Module.__call__` patch (default config)
    jit backend.infer             the chosen backend called directly (no hook, no dispatcher)

The difference between the last two is aitune's per-call dispatch cost; between `compile:<mode>` and
`jit backend.infer` it is what the backend adds (output copies for CUDA graphs, autocast, mode checks). With
`--mode reduce-overhead` on CUDA three more rows split that: the backend's compiled module called directly, then
with `cudagraph_mark_step_begin()` before it, then also with the output copy after it.

    python -m benchmarks.probes.tuned_call_overhead --model resnet50 --batches 1 32          # GPU
    python -m benchmarks.probes.tuned_call_overhead --model tiny_resnet --batches 1 --device cpu
    python -m benchmarks.probes.tuned_call_overhead --model micro --batches 2 --device cpu --mode default

`jit_hook_again` measures the hook path once more at the end: a gap to `jit_hook` is a transient after tuning,
not a cost of the path. Each row also records the dynamo/Inductor counters its calls moved (recompiles, CUDA
graph skips and re-recordings show up there), `--profile` keeps the top ops by host time of 50 calls of every
row, and `--log-cudagraphs` logs each CUDA graph recording: the tools for finding out why the hook path costs
more than `backend.infer` on one host and not on another (docs/benchmarks.md has such measurements).

`jit dispatcher` calls the node's public `PatchedModule.dispatcher` (a `GraphDispatcher`) directly: the graph
match and the backend, without the hook and without the forward wrapper.

`micro` is one Linear(8, 8) + ReLU (tuned with `min_parameters=0`): its forward costs microseconds, so the rows
expose aitune's per-call cost.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import statistics

import torch

from benchmarks import common
from benchmarks.suite import call_profiles, models
from benchmarks.suite.timing import median_ms


class _Micro(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def _build(name: str, batch: int, device: str) -> tuple[torch.nn.Module, models.Batch]:
    if name == "micro":
        torch.manual_seed(models.MODEL_SEED)
        return _Micro().to(device).eval(), models.Batch((torch.randn(batch, 8, device=device),))
    built = models.build(name, batch)
    return built.module.to(device).eval(), built.make_inputs(0).to(device)


def _with_mark_step(fn, clone: bool = False):
    """`fn` preceded by `cudagraph_mark_step_begin()` and optionally followed by a clone of its output tensors."""

    def call(*args, **kwargs):
        torch.compiler.cudagraph_mark_step_begin()
        out = fn(*args, **kwargs)
        if clone:
            out = torch.utils._pytree.tree_map_only(torch.Tensor, torch.Tensor.clone, out)
        return out

    return call


def counter_snapshot() -> dict[str, int]:
    """dynamo's and Inductor's event counters (recompiles, graph breaks, CUDA graph skips...) as flat keys."""
    from torch._dynamo.utils import counters

    return {f"{group}.{key}": int(value) for group, keys in counters.items() for key, value in keys.items()}


def counter_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """The counters that moved between two snapshots: what a measured call path made torch do again."""
    return {key: after[key] - before.get(key, 0) for key in sorted(after) if after[key] != before.get(key, 0)}


class _Probe:
    """Measures one call path into `row`: its median, the counters it moved and, optionally, a CPU profile."""

    def __init__(
        self, row: dict[str, object], batch: models.Batch, device: str, iters: int, *, profile: bool, pyprofile: bool
    ) -> None:
        self.row, self.batch, self.device, self.iters = row, batch, device, iters
        self.profile, self.pyprofile = profile, pyprofile
        row["counters"] = {}

    def measure(self, name: str, fn, autocast: str = "none") -> None:
        """`autocast="bf16"` runs the calls under the user's autocast (the hand-written comparators)."""
        before = counter_snapshot()
        self.row[f"{name}_ms"] = median_ms(fn, self.batch, self.device, self.iters, autocast)
        moved = counter_delta(before, counter_snapshot())
        if moved:
            self.row["counters"][name] = moved  # type: ignore[index]
        if self.profile:
            self.row[f"profile_{name}"] = profile_table(fn, self.batch, self.device, autocast=autocast)
        if self.pyprofile:
            self.row[f"pyprofile_{name}"] = python_profile(fn, self.batch, self.device, autocast=autocast)


def profile_table(fn, batch: models.Batch, device: str, calls: int = 50, autocast: str = "none") -> list[str]:
    """Top ops by self CPU time over `calls` calls: where a slower call path spends its host time."""
    return call_profiles.op_table(models.caller(fn, torch.device(device).type, autocast), batch, device, calls)


def python_profile(fn, batch: models.Batch, device: str, calls: int = 200, autocast: str = "none") -> list[str]:
    """Top Python functions by own time over `calls` calls (cProfile; see call_profiles)."""
    return call_profiles.python_table(models.caller(fn, torch.device(device).type, autocast), batch, device, calls)


def _dispatcher_call(node):
    """The node's dispatcher (graph match + backend) called directly: no hook, no forward wrapper."""
    dispatcher = node.dispatcher

    def call(*args, **kwargs):
        return dispatcher(*args, **kwargs)

    return call


def measure_jit(probe: _Probe, tuned: torch.nn.Module, args: argparse.Namespace) -> None:
    """The JIT rows, outermost first: hook, forward wrapper, dispatcher, backend, its compiled module."""
    from aitune.torch import PatchedModule

    row = probe.row
    node = PatchedModule.of(tuned)
    row["jit_state"] = str(node.state) if node is not None else "not a node"
    probe.measure("jit_hook", tuned)
    if node is None or not node.backends:
        return
    backend = node.backends[0]
    row["jit_backend"] = backend.describe()
    probe.measure("jit_forward_wrapper", tuned.forward)
    if node.dispatcher is not None:
        probe.measure("jit_dispatcher", _dispatcher_call(node))
    probe.measure("jit_backend_infer", backend.infer)
    inner = getattr(backend, "_compiled", None)
    cuda_graphs = args.mode == "reduce-overhead" and args.device.startswith("cuda") and args.precision == "fp32"
    if inner is not None and cuda_graphs:
        # what the backend adds around the same compiled code, one piece at a time
        probe.measure("jit_compiled_direct", inner)
        probe.measure("jit_compiled_mark_step", _with_mark_step(inner))
        probe.measure("jit_compiled_mark_step_clone", _with_mark_step(inner, clone=True))
    # the hook once more, last: a difference from the first jit_hook row is a transient after tuning
    probe.measure("jit_hook_again", tuned)
    if node.dispatcher is not None and node.dispatcher.watch is not None:
        row.update(watch_cost(tuned, node.dispatcher, probe.batch, probe.device, probe.iters))


def watch_cost(tuned: torch.nn.Module, dispatcher, batch: models.Batch, device: str, iters: int,
               rounds: int = 6) -> dict[str, object]:
    """What the dispatcher's change check (its `ModuleWatch`) adds to a whole tuned call through the hook:
    alternating rounds with the watch and with it taken off the dispatcher for the round, median of the per-round
    ratios (the watch is put back whatever happens)."""
    watched, unwatched = [], []
    saved = dispatcher._watch
    for index in range(rounds):
        for with_watch in ((True, False) if index % 2 == 0 else (False, True)):
            dispatcher._watch = saved if with_watch else None
            try:
                (watched if with_watch else unwatched).append(median_ms(tuned, batch, device, iters))
            finally:
                dispatcher._watch = saved
    ratios = sorted(w / u for w, u in zip(watched, unwatched, strict=True))
    return {"jit_hook_watched_ms": statistics.median(watched), "jit_hook_unwatched_ms": statistics.median(unwatched),
            "watch_cost_ratio": statistics.median(ratios), "watch_cost_ratios": ratios}


def main(argv: list[str] | None = None) -> int:
    parser = common.case_options(common.parser(__doc__), model="resnet50", batches=[1, 32])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--mode", default="reduce-overhead")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--settle", type=int, default=20, help="stable calls that end the warm-up")
    parser.add_argument("--profile", action="store_true",
                        help="also profile 50 calls of each row (torch.profiler) and keep its top CPU ops in the JSON")
    parser.add_argument("--pyprofile", action="store_true",
                        help="also profile 200 calls of each row with cProfile and keep its top Python functions")
    parser.add_argument("--log-cudagraphs", action="store_true",
                        help="log CUDA graph recordings and re-recordings (torch._logging cudagraphs)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.log_cudagraphs:
        torch._logging.set_logs(cudagraphs=True)

    import aitune.torch.jit as jit
    from aitune.torch import jit_config

    header = common.environment("tuned_call_overhead", args.device, args.git_commit)
    autocast = "bf16" if args.precision == "bf16" else "none"

    rows = []
    for batch in args.batches:
        base, x = _build(args.model, batch, args.device)
        row: dict[str, object] = {"model": args.model, "batch": batch, "precision": args.precision}
        probe = _Probe(row, x, args.device, args.iters, profile=args.profile, pyprofile=args.pyprofile)
        probe.measure("eager", base, autocast)
        compiled = torch.compile(copy.deepcopy(base), mode=None if args.mode == "default" else args.mode)
        probe.measure(f"compile_{args.mode}", compiled, autocast)

        jit_config.device = args.device
        jit_config.blocking = True  # tuned within the warm-up calls below: the tuned call is what is measured
        jit_config.precision = "bf16" if args.precision == "bf16" else None
        if args.model == "micro":
            jit_config.min_parameters = 0  # 72 parameters: below the default threshold on purpose
        jit.enable()
        try:
            tuned = copy.deepcopy(base)
            with torch.no_grad():
                for _ in range(jit_config.min_samples + 3):
                    tuned(*x.args, **x.kwargs)
            measure_jit(probe, tuned, args)
        finally:
            jit.disable()
        # the hand-written compile once more, after the JIT's backend ran in this process (it calls
        # cudagraph_mark_step_begin, which changes how CUDA-graph trees count generations process-wide)
        probe.measure(f"compile_{args.mode}_again", compiled, autocast)
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if not k.startswith(("profile", "pyprofile"))}))

    document = {**header, "aitune_jit_config": repr(jit_config), "rows": rows}
    path = common.result_path(header, args.model, args.precision, out=args.out)
    common.write_result(path, document)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
