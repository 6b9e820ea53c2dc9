"""Does compiling a second `torch.compile` of the same module slow down the first one?

The JIT's default strategy compiles Inductor `reduce-overhead` (CUDA graphs), and when that is not clearly
faster than eager also the default mode, then keeps the faster one. In the GPU suite the JIT was slower than
`torch.compile(mode="reduce-overhead")` exactly in the cases where it had compiled both. This script measures
that effect alone, side by side in one process on one model copy:

    ro alone                 torch.compile(m, mode="reduce-overhead") after its warm-up
    ro after default         the same wrapper, after torch.compile(m) (default mode) was compiled and called
    default                  that default-mode wrapper
    ro own code (alone / after default)
                             the same two steps, each wrapper compiling its own copy of forward's code object
                             (dynamo keeps its cache per code object; a copy gives each wrapper a cache of its own)

    python -m benchmarks.probes.compile_interference --model bert_base --batches 8      # GPU
    python -m benchmarks.probes.compile_interference --model tiny_bert --batches 2 --device cpu --iters 20
"""

from __future__ import annotations

import copy
import json
import logging
import types

import torch

from benchmarks import common
from benchmarks.suite import models
from benchmarks.suite.timing import median_ms


class OwnCode(torch.nn.Module):
    """`module`'s forward through a fresh copy of its code object (same globals, closure and defaults)."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self.module = module
        fn = type(module).forward
        own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
        own.__kwdefaults__ = fn.__kwdefaults__
        self.forward = types.MethodType(own, module)


def _pair(target: torch.nn.Module, second: torch.nn.Module, batch: models.Batch, device: str,
          iters: int, ro_mode: str) -> tuple[float, float, float]:
    """(ro alone, ro after a default-mode compile of `second`, that default-mode compile)."""
    ro = torch.compile(target, mode=ro_mode)
    alone = median_ms(ro, batch, device, iters)
    default = torch.compile(second)
    default_ms = median_ms(default, batch, device, iters)
    after = median_ms(ro, batch, device, iters)
    return alone, after, default_ms


def main(argv: list[str] | None = None) -> int:
    parser = common.case_options(common.parser(__doc__), model="bert_base", batches=[8], precision=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--mode", default="reduce-overhead", help="the first wrapper's mode")
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    header = common.environment("compile_interference", args.device, args.git_commit)

    rows = []
    for batch in args.batches:
        built = models.build(args.model, batch)
        base = built.module.to(args.device).eval()
        x = built.make_inputs(0).to(args.device)
        row: dict[str, object] = {"model": args.model, "batch": batch}
        row["eager_ms"] = median_ms(base, x, args.device, args.iters)
        shared = copy.deepcopy(base)
        row["ro_alone_ms"], row["ro_after_default_ms"], row["default_ms"] = _pair(
            shared, shared, x, args.device, args.iters, args.mode
        )
        torch._dynamo.reset()
        own = copy.deepcopy(base)
        row["ro_own_code_alone_ms"], row["ro_own_code_after_default_ms"], row["default_own_code_ms"] = _pair(
            OwnCode(own), OwnCode(own), x, args.device, args.iters, args.mode
        )
        torch._dynamo.reset()
        rows.append(row)
        print(json.dumps(row), flush=True)

    common.write_result(common.result_path(header, args.model, out=args.out), {**header, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
