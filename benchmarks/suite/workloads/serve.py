"""A plain PyTorch serving workload: build a model, serve a stream of batches, time every call.

This script never imports aitune. The benchmark suites run it as a subprocess in two ways:

    python -m benchmarks.suite.workloads.serve --model resnet50 --batch 8 --out r.json        # eager
    AUTOWRAPT_BOOTSTRAP=aitune_enable_jit_tuning \
        python -m benchmarks.suite.workloads.serve --model resnet50 --batch 8 --out r.json    # aitune JIT

so the JIT contender is measured on an unmodified script, from the outside: the per-call latencies and
wall-clock stamps it writes show when the calls became fast (see timing.py for the time-to-tuned rule).
`--contender compile:<mode>` runs torch.compile in the same script for a like-for-like comparison, and
`--autocast bf16` wraps every call in bf16 autocast, as a user who wants bf16 would.

Output JSON: model/source/batch, device, torch version, weights checksum, whether `nn.Module.__call__`
had been replaced when the model was built (the JIT hook's footprint, seen without importing aitune),
the serving-loop result and, with `--check-out`, the primary output for each check seed saved as a
list of CPU tensors for the suite to compare against eager.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

import torch

from benchmarks.suite import call_profiles, models, timing

#: `SERVE_LOGGERS="aitune=INFO"` raises or lowers named loggers (comma-separated `name=LEVEL`), e.g. to see how
#: long each step of JIT tuning took; set in the suite's environment, it reaches every workload.
LOGGERS_ENV = "SERVE_LOGGERS"


def set_logger_levels(spec: str) -> None:
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, sep, level = item.partition("=")
        if not sep or not name.strip() or not isinstance(logging.getLevelName(level.strip().upper()), int):
            raise SystemExit(f"{LOGGERS_ENV}: expected name=LEVEL items, got {item!r}")
        logging.getLogger(name.strip()).setLevel(level.strip().upper())


def module_call_patched() -> bool:
    """True when something replaced torch.nn.Module.__call__ (the JIT hook does); plain introspection."""
    return torch.nn.Module.__dict__["__call__"] is not torch.nn.Module.__dict__["_wrapped_call_impl"]


def make_callable(module: torch.nn.Module, contender: str, autocast: str, device: torch.device):
    if contender == "eager":
        target = module
    elif contender.startswith("compile:"):
        target = torch.compile(module, mode=contender.split(":", 1)[1])
    else:
        raise SystemExit(f"unknown contender {contender!r}: eager or compile:<mode>")
    return models.caller(target, device.type, autocast)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, choices=sorted(models.ALL_MODELS))
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--contender", default="eager", help="eager (default) or compile:<mode>")
    p.add_argument("--autocast", choices=["none", "bf16"], default="none")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--settle", type=int, default=20)
    p.add_argument("--min-timed-s", type=float, default=0.0, help="time calls for at least this long (timing.py)")
    p.add_argument("--max-warmup-s", type=float, default=300.0)
    p.add_argument("--n-inputs", type=int, default=4, help="input sets rotated through (seeds 0..n-1)")
    p.add_argument("--check-seeds", type=int, nargs="*", default=[1000, 1001])
    p.add_argument("--check-out", type=Path, help="save the outputs for the check seeds here (torch.save)")
    p.add_argument("--profile-calls", type=int, default=0,
                   help="after serving, profile this many more calls (torch.profiler ops and cProfile functions) "
                        "into the JSON: where a contender's per-call time goes")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    # A server configures logging; warnings from any library (aitune's JIT prints its tuning summary at exit
    # as one) then reach the log the suite keeps.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    set_logger_levels(os.environ.get(LOGGERS_ENV, ""))

    t_start = time.perf_counter()
    device = torch.device(args.device)
    built = models.build(args.model, args.batch)
    checksum = models.weights_checksum(built.module)
    module = built.module.to(device)
    inputs = [built.make_inputs(seed).to(device) for seed in range(args.n_inputs)]
    t_compile = time.perf_counter()
    call = make_callable(module, args.contender, args.autocast, device)
    t_built = time.perf_counter()

    with torch.no_grad():
        served = timing.serve_loop(
            call, inputs, device, warmup=args.warmup, iters=args.iters, settle=args.settle,
            max_warmup_s=args.max_warmup_s, min_timed_s=args.min_timed_s,
        )
        outputs = []
        for seed in args.check_seeds:
            out = call(built.make_inputs(seed).to(device))
            outputs.append(models.primary_output(out).detach().float().cpu().clone())
    if args.check_out:
        torch.save(outputs, args.check_out)
    profiles = {}
    if args.profile_calls > 0:
        profiles = {
            "profile_ops": call_profiles.op_table(call, inputs[0], str(device), calls=args.profile_calls),
            "profile_python": call_profiles.python_table(call, inputs[0], str(device), calls=args.profile_calls),
        }
        if device.type == "cuda":  # the kernels by GPU time: do two processes run the same ones?
            profiles["profile_kernels"] = call_profiles.op_table(
                call, inputs[0], str(device), calls=args.profile_calls, rows=40, sort_by="self_cuda_time_total")

    result = {
        "model": built.name,
        "model_source": built.source,
        "batch": args.batch,
        "contender": args.contender,
        "autocast": args.autocast,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "pid": os.getpid(),
        "weights_checksum": checksum,
        "module_call_patched": module_call_patched(),
        "build_s": t_built - t_start,
        # the `torch.compile()` line imports Inductor (seconds on a GPU host): part of what torch.compile's
        # first answer costs a script, as the JIT pays the same import on its worker
        "compile_call_s": t_built - t_compile,
        "serve": served.to_dict(),
        "check_seeds": args.check_seeds,
        **profiles,
    }
    args.out.write_text(json.dumps(result, indent=1))
    print(
        f"serve.py {built.name} b={args.batch} {args.contender}: median {served.stats.median_ms:.3f} ms, "
        f"first call {served.first_call_s:.2f} s, steady after {served.time_to_steady_s:.2f} s, "
        f"warm-up calls {len(served.warmup_ms)}, Module.__call__ patched: {result['module_call_patched']}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
