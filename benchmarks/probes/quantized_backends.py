"""Quantized backends (TorchAO) against eager: correctness and throughput on ResNet-50 and BERT-base.

    python -m benchmarks.probes.quantized_backends              # GPU: resnet50 + bert_base (seq 128), batch 32
    python -m benchmarks.probes.quantized_backends --cpu --tiny # CPU smoke check on the tiny stand-in models

Every model is run by these contenders, each through aitune's own code path (record two calls, then
`OneBackendStrategy(backend).tune_with_report(...)`, which builds and validates against the recorded eager outputs
with the quantized tolerance):

- `eager`: the model as is (fp32): the reference outputs and the baseline throughput;
- `inductor`: `TorchInductorBackend()` (fp32 torch.compile), so the speed-up of quantization is not confused with
  the speed-up of compiling (omit with `--no-inductor`);
- `torchao:int8-weight-only`: `TorchAOBackend(Int8WeightOnlyConfig())`;
- `torchao:int8-dynamic`: `TorchAOBackend(Int8DynamicActivationInt8WeightConfig())`;
- `torchao:float8-dynamic`: `TorchAOBackend(Float8DynamicActivationFloat8WeightConfig())` (one scale per tensor),
  and `torchao:float8-dynamic-row` with `granularity=PerRow()` (one scale per row: finer, so more accurate), only on
  a CUDA device of compute capability >= 8.9 (otherwise the row says why it was skipped).

TorchAO backends compile the quantized copy with Inductor (`compile=True`, the backend default) unless
`--no-compile`. A candidate the validation rejects is reported as `rejected` with the error; it is then built
again without validation and timed for reference (`reference` in its row, "timed for reference only" in the
table: what it would have bought and at what error; aitune never serves it). `--no-time-rejected` skips that.

Correctness is measured on fresh inputs (other seeds than the recorded calls), on the model's primary output
(the logits; BERT's last hidden state) against eager fp32:
`max_rel_err = max|out - ref| / max|ref|`, `rel_l2 = ||out - ref|| / ||ref||` and `max_abs_err`.
Throughput is `batch / median latency` of a serving loop (`timing.serve_loop`: CUDA events on GPU).

Results: a table on stdout and a JSON file (benchmarks/results/local/ unless `--out` names one: the environment
header of benchmarks/common.py, the arguments, one row per model and contender), mirrored to `$OUT` when that
folder exists.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import shutil
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from aitune.torch import OneBackendStrategy
from aitune.torch.backend import Backend, TorchAOBackend, TorchAOBackendConfig, TorchInductorBackend
from aitune_core.recording.graph_recorder import GraphRecorder
from benchmarks import common
from benchmarks.suite import models, timing

GPU_MODELS = ("resnet50", "bert_base")
TINY_MODELS = ("tiny_resnet", "tiny_bert")
TORCHAO_CONTENDERS = ("torchao:int8-weight-only", "torchao:int8-dynamic", "torchao:float8-dynamic",
                      "torchao:float8-dynamic-row")


def torchao_config(contender: str) -> Any:
    import torchao.quantization as q

    return {
        "torchao:int8-weight-only": q.Int8WeightOnlyConfig,
        "torchao:int8-dynamic": q.Int8DynamicActivationInt8WeightConfig,
        "torchao:float8-dynamic": q.Float8DynamicActivationFloat8WeightConfig,
        "torchao:float8-dynamic-row": lambda: q.Float8DynamicActivationFloat8WeightConfig(granularity=q.PerRow()),
    }[contender]()


def skip_reason(contender: str, device: torch.device) -> str | None:
    """Why a contender cannot run here (None when it can)."""
    if contender.startswith("torchao:"):
        try:
            import torchao  # noqa: F401
        except ImportError:
            return "torchao is not installed"
    if contender.startswith("torchao:float8"):
        if device.type != "cuda":
            return "float8 needs a CUDA device"
        capability = torch.cuda.get_device_capability(device)
        if tuple(capability) < (8, 9):
            return f"float8 needs compute capability >= 8.9 (this GPU has {capability[0]}.{capability[1]})"
    return None


def make_backend(contender: str, compile_quantized: bool) -> Backend:
    if contender == "inductor":
        return TorchInductorBackend()
    config = TorchAOBackendConfig(quantization_config=torchao_config(contender), compile=compile_quantized)
    return TorchAOBackend(config)


def errors(out: Any, ref: Any) -> dict[str, float]:
    a = models.primary_output(out).detach().to("cpu", torch.float64)
    b = models.primary_output(ref).detach().to("cpu", torch.float64)
    rel_l2, max_abs = timing.relative_error(a, b)
    scale = b.abs().max().item()
    return {"max_rel_err": max_abs / scale if scale > 0 else max_abs, "rel_l2": rel_l2, "max_abs_err": max_abs}


def worst_errors(per_input: list[dict[str, float]]) -> dict[str, float]:
    return {key: max(e[key] for e in per_input) for key in per_input[0]}


def record_graph(model: torch.nn.Module, built_small: models.BuiltModel, built: models.BuiltModel,
                 device: torch.device) -> tuple[Any, list[Any]]:
    """Two recorded calls (half batch and full batch) with their eager outputs: the graph and its samples."""
    recorder = GraphRecorder(model)
    with torch.no_grad():
        for seed, source in ((0, built_small), (1, built)):
            batch = source.make_inputs(seed).to(device)
            recorder.record(batch.args, batch.kwargs, model(*batch.args, **batch.kwargs))
    (spec,) = recorder.graph_specs
    return spec, recorder.samples(spec)


def serve(fn: Any, inputs: list[models.Batch], device: torch.device, args: argparse.Namespace) -> timing.ServeResult:
    with torch.no_grad():
        return timing.serve_loop(lambda b: fn(*b.args, **b.kwargs), inputs, device, warmup=args.warmup,
                                 iters=args.iters, settle=args.settle, max_warmup_s=args.max_warmup_s)


def run_model(name: str, device: torch.device, args: argparse.Namespace, contenders: list[str],
              cache_dir: Path) -> list[dict[str, Any]]:
    built = models.build(name, args.batch)
    small = models.build(name, max(1, args.batch // 2))
    model = built.module.to(device)
    inputs = [built.make_inputs(seed).to(device) for seed in (100, 101, 102)]  # never recorded
    with torch.no_grad():
        references = [model(*b.args, **b.kwargs) for b in inputs]
    spec, samples = record_graph(model, small, built, device)
    base = {"model": name, "source": built.source, "batch": args.batch,
            "parameters": sum(p.numel() for p in model.parameters())}
    rows: list[dict[str, Any]] = []

    result = serve(model, inputs, device, args)
    eager_ms = result.stats.median_ms
    rows.append({**base, "contender": "eager", "status": "ok", "max_rel_err": 0.0, "rel_l2": 0.0, "max_abs_err": 0.0,
                 "latency_ms": eager_ms, "throughput": timing.throughput(args.batch, eager_ms), "speedup": 1.0,
                 "timing": result.to_dict(keep_series=False)})
    print(f"  {name} eager: {eager_ms:.3f} ms", flush=True)

    for contender in contenders:
        row: dict[str, Any] = {**base, "contender": contender}
        reason = skip_reason(contender, device)
        if reason:
            rows.append({**row, "status": "skipped", "error": reason})
            print(f"  {name} {contender}: skipped ({reason})", flush=True)
            continue
        backend = make_backend(contender, not args.no_compile)
        row["backend"] = backend.describe()
        started = time.perf_counter()
        try:
            report = OneBackendStrategy(backend).tune_with_report(model, name, spec, samples, device, cache_dir)
        except Exception as exc:  # a rejected or failed candidate is a result, not a crash
            status = "rejected" if type(exc).__name__ == "ValidationError" else "failed"
            row.update({"status": status, "error": f"{type(exc).__name__}: {exc}"[:2000],
                        "tune_s": time.perf_counter() - started})
            print(f"  {name} {contender}: {status}: {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            if status == "rejected" and args.time_rejected:
                row["reference"] = time_for_reference(
                    contender, not args.no_compile, (model, spec, samples, cache_dir), inputs, references, device,
                    args, eager_ms,
                )
            rows.append(row)
            continue
        tuned = report.backend
        row["tune_s"] = time.perf_counter() - started
        with torch.no_grad():
            row.update(worst_errors([errors(tuned.infer(*b.args, **b.kwargs), ref)
                                     for b, ref in zip(inputs, references)]))
        result = serve(tuned.infer, inputs, device, args)
        ms = result.stats.median_ms
        row.update({"status": "ok", "latency_ms": ms, "throughput": timing.throughput(args.batch, ms),
                    "speedup": eager_ms / ms, "timing": result.to_dict(keep_series=False)})
        rows.append(row)
        print(f"  {name} {contender}: {ms:.3f} ms, max_rel_err {row['max_rel_err']:.3g}", flush=True)
        tuned.deactivate()
        del tuned, report, backend
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def time_for_reference(contender: str, compile_quantized: bool, recorded: tuple[Any, Any, Any, Path],
                       inputs: list[models.Batch], references: list[Any], device: torch.device,
                       args: argparse.Namespace, eager_ms: float) -> dict[str, Any]:
    """Errors and latency of a candidate that validation rejected, built again without validating.

    Only for the table: what the rejected configuration would have bought, and at what error. aitune never
    serves such a backend.
    """
    model, spec, samples, cache_dir = recorded
    backend = make_backend(contender, compile_quantized)
    try:
        backend.build(model, spec, samples, device, cache_dir)
        with torch.no_grad():
            outputs = [backend.infer(*b.args, **b.kwargs) for b in inputs]
        found = worst_errors([errors(out, ref) for out, ref in zip(outputs, references)])
        ms = serve(backend.infer, inputs, device, args).stats.median_ms
    except Exception as exc:  # e.g. the library error that made validation fail happens again
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}
    finally:
        if backend.is_active:
            backend.deactivate()
    print(f"  {contender} (rejected) for reference: {ms:.3f} ms, max_rel_err {found['max_rel_err']:.3g}", flush=True)
    return {**found, "latency_ms": ms, "throughput": timing.throughput(args.batch, ms), "speedup": eager_ms / ms}


def format_table(rows: list[dict[str, Any]]) -> str:
    header = ("model", "contender", "status", "max_rel_err", "rel_l2", "latency_ms", "throughput/s", "vs eager")
    lines = [header]
    for r in rows:
        ok = r["status"] == "ok"
        status = r["status"] if ok else f"{r['status']}: {r.get('error', '')[:60]}"
        if "latency_ms" in r.get("reference", {}):  # a rejected candidate timed for reference: not usable
            r, status = {**r, **r["reference"]}, "rejected (timed for reference only)"
            ok = True
        lines.append((
            r["model"], r["contender"], status,
            f"{r['max_rel_err']:.2e}" if ok else "-", f"{r['rel_l2']:.2e}" if ok else "-",
            f"{r['latency_ms']:.3f}" if ok else "-", f"{r['throughput']:.1f}" if ok else "-",
            f"{r['speedup']:.2f}x" if ok else "-",
        ))
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    out = [" | ".join(str(c).ljust(w) for c, w in zip(line, widths)) for line in lines]
    out.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = common.parser(__doc__)
    parser.add_argument("--cpu", action="store_true", help="run on the CPU (default: CUDA)")
    parser.add_argument("--tiny", action="store_true", help="tiny stand-in models instead of resnet50 / bert_base")
    parser.add_argument("--models", nargs="+", help="model names from benchmarks/suite/models.py")
    parser.add_argument("--contenders", nargs="+", choices=("inductor", *TORCHAO_CONTENDERS),
                        help="contenders besides eager (default: all)")
    parser.add_argument("--no-inductor", action="store_true", help="leave out the fp32 torch.compile row")
    parser.add_argument("--no-compile", action="store_true", help="TorchAO backends with compile=False")
    parser.add_argument("--batch", type=int, help="batch size (default 32 on GPU, 8 with --cpu)")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--iters", type=int, help="timed calls (default 100 on GPU, 20 with --cpu)")
    parser.add_argument("--settle", type=int, default=10)
    parser.add_argument("--max-warmup-s", type=float, default=120.0)
    parser.add_argument("--no-time-rejected", dest="time_rejected", action="store_false",
                        help="do not build and time candidates that validation rejected (by default they are, "
                             "for reference: the table shows what they would have bought, at what error)")
    args = parser.parse_args(argv)
    args.batch = args.batch or (8 if args.cpu else 32)
    args.iters = args.iters or (20 if args.cpu else 100)

    if args.cpu:
        device = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            parser.error("no CUDA device; use --cpu (with --tiny for the smoke check)")
        device = torch.device("cuda", torch.cuda.current_device())
    names = args.models or list(TINY_MODELS if args.tiny else GPU_MODELS)
    contenders = list(args.contenders or ("inductor", *TORCHAO_CONTENDERS))
    if args.no_inductor and "inductor" in contenders:
        contenders.remove("inductor")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s - %(levelname)s - %(message)s")

    header = common.environment("quantized_backends", str(device), args.git_commit)
    device_name = header["device"]["name"]
    out = common.result_path(header, *names, out=args.out)
    doc: dict[str, Any] = {
        **header,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "rows": [],
    }
    print(f"quantized backends on {device_name} ({device}), torch {torch.__version__}, models {names}", flush=True)
    cache_dir = Path(tempfile.mkdtemp(prefix="aitune-quantized-bench-"))
    try:
        for name in names:
            try:
                doc["rows"].extend(run_model(name, device, args, contenders, cache_dir))
            except models.ModelUnavailable as exc:
                doc["rows"].append({"model": name, "contender": "eager", "status": "skipped", "error": str(exc)})
            except Exception as exc:
                traceback.print_exc()
                doc["rows"].append({"model": name, "contender": "eager", "status": "failed",
                                    "error": f"{type(exc).__name__}: {exc}"[:2000]})
            write(doc, out)
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    print()
    print(format_table(doc["rows"]))
    common.write_result(out, doc)
    return 0


def write(doc: dict[str, Any], out: Path) -> None:
    """Save after every model (a run cut short keeps what it measured), mirrored to $OUT when it exists."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    mirror = os.environ.get("OUT")
    if mirror and Path(mirror).is_dir():
        shutil.copy(out, Path(mirror) / out.name)


if __name__ == "__main__":
    raise SystemExit(main())
