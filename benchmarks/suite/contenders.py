"""The contenders of a benchmark case (one model at one batch size and precision) and how each is run.

In-process (this process, the same inputs, the same timing code):
  eager                               the model as built
  compile:<mode>                      torch.compile(model, mode=...) after torch._dynamo.reset()
  aitune-aot                          aitune.torch.Module + aitune.torch.tune with HighestThroughputStrategy()
In a subprocess running the plain workload script benchmarks/suite/workloads/serve.py:
  aitune-jit                          the same script with AUTOWRAPT_BOOTSTRAP=aitune_enable_jit_tuning
  eager (workload)                    the same script without it: the JIT's like-for-like eager baseline
  compile:default (workload)          the same script calling torch.compile(model): its first call is the
                                      JIT's like-for-like comparator for time-to-tuned (a fresh process with
                                      the same cache policy as the JIT's, not one warmed by earlier compiles)

Every contender is checked on fresh inputs (seeds not used for timing) against the fp32 eager output of
this process: `rel_err` is the largest ||out - ref|| / ||ref|| over the check seeds.

Only the public aitune API is used (`aitune.torch`), imported lazily so that the eager and torch.compile
contenders run in a process untouched by aitune.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib.util
import json
import logging
import os
import shlex
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import LOCAL_RESULTS_DIR, REPO, slug
from benchmarks.suite import call_profiles, models, timing

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
# blocking: the suite times the tuned model and the first calls' cost as they were before background tuning
JIT_ENV = {"AUTOWRAPT_BOOTSTRAP": "aitune_enable_jit_tuning", "AITUNE_JIT_BLOCKING": "1"}
# The JIT's opt-in precision, read from the environment by the JIT config (the workload stays unmodified).
JIT_PRECISION_ENV = "AITUNE_JIT_PRECISION"
#: the plain workload script, run as `python -m` from the repository root
WORKLOAD = "benchmarks.suite.workloads.serve"
#: timed latencies kept per result row (the rest is summarized by `timed_chunk_medians_ms`)
SERIES_KEPT = 200
#: "compile:<mode> (workload)" runs torch.compile inside the workload script, in a process of its own
WORKLOAD_SUFFIX = " (workload)"


@dataclasses.dataclass
class Settings:
    device: str
    precision: str = "fp32"  # "fp32" or "bf16" (autocast)
    warmup: int = 20
    iters: int = 100
    min_timed_s: float = 0.0
    settle: int = 20
    max_warmup_s: float = 120.0
    n_inputs: int = 4
    check_seeds: tuple[int, ...] = (1000, 1001)
    work_dir: Path = LOCAL_RESULTS_DIR
    profile_calls: int = 0  # workload contenders: profile this many more calls after serving (serve.py)

    @property
    def autocast(self) -> str:
        return "bf16" if self.precision == "bf16" else "none"


@dataclasses.dataclass
class Case:
    """One model at one batch size, with its inputs and the fp32 eager reference outputs."""

    built: models.BuiltModel
    inputs: list[models.Batch]  # on the device, seeds 0..n_inputs-1
    check_inputs: list[models.Batch]  # on the device, the check seeds
    reference: list[torch.Tensor]  # fp32 eager primary outputs for check_inputs, on the CPU
    checksum: float


def row_template(case_or_name: Any, batch: int, precision: str, contender: str) -> dict[str, Any]:
    if isinstance(case_or_name, Case):
        model, source = case_or_name.built.name, case_or_name.built.source
    else:
        model, source = case_or_name, None
    return {"model": model, "model_source": source, "batch": batch, "precision": precision,
            "contender": contender, "status": "ok", "reason": None}


def skipped(row: dict[str, Any], reason: str, status: str = "skipped") -> dict[str, Any]:
    row.update(status=status, reason=reason)
    return row


def fill_serve(row: dict[str, Any], batch: int, served: dict[str, Any]) -> dict[str, Any]:
    """Copy a ServeResult dict (timing.ServeResult.to_dict) into a result row."""
    stats = served["stats"]
    row.update(
        median_ms=stats["median_ms"], p10_ms=stats["p10_ms"], p90_ms=stats["p90_ms"],
        throughput=timing.throughput(batch, stats["median_ms"]),
        first_call_s=served["first_call_s"], time_to_steady_s=served["time_to_steady_s"],
        settled=served["settled"], slow_timed_calls=served["slow_timed_calls"], n_warmup=served["n_warmup"],
        # the whole timed series can be thousands of calls (min_timed_s): keep its start and its drift
        series={"warmup_ms": served.get("warmup_ms"), "timed_ms": (served.get("timed_ms") or [])[:SERIES_KEPT]},
        timed_chunk_medians_ms=timing.chunk_medians(served.get("timed_ms")),
    )
    return row


def fill_check(row: dict[str, Any], outputs: list[torch.Tensor], reference: list[torch.Tensor]) -> dict[str, Any]:
    errs = [timing.relative_error(o, r) for o, r in zip(outputs, reference, strict=True)]
    row.update(rel_err=max(e[0] for e in errs), max_abs_err=max(e[1] for e in errs))
    return row


def free_memory() -> None:
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def make_case(name: str, batch: int, settings: Settings) -> Case:
    built = models.build(name, batch)
    checksum = models.weights_checksum(built.module)
    device = torch.device(settings.device)
    built.module.to(device)
    inputs = [built.make_inputs(seed).to(device) for seed in range(settings.n_inputs)]
    check_inputs = [built.make_inputs(seed).to(device) for seed in settings.check_seeds]
    with torch.no_grad():
        reference = [models.primary_output(built.module(*b.args, **b.kwargs)).float().cpu() for b in check_inputs]
    return Case(built, inputs, check_inputs, reference, checksum)


def _serve_and_check(row: dict[str, Any], case: Case, target: Callable[..., Any], settings: Settings) -> None:
    call = models.caller(target, torch.device(settings.device).type, settings.autocast)
    with torch.no_grad():
        served = timing.serve_loop(
            call, case.inputs, settings.device, warmup=settings.warmup, iters=settings.iters,
            settle=settings.settle, max_warmup_s=settings.max_warmup_s, min_timed_s=settings.min_timed_s,
        )
        outputs = [models.primary_output(call(b)).detach().float().cpu().clone() for b in case.check_inputs]
    fill_serve(row, case.built.batch, served.to_dict())
    fill_check(row, outputs, case.reference)


def _guarded(row: dict[str, Any], body: Callable[[], None]) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        body()
    except Exception as exc:  # a contender that fails is a result, not the end of the suite
        skipped(row, f"{type(exc).__name__}: {exc}".splitlines()[0][:300], status="failed")
        row["traceback"] = traceback.format_exc()[-4000:]
    finally:
        row["wall_s"] = time.perf_counter() - t0
        free_memory()
    return row


def run_eager(case: Case, settings: Settings) -> dict[str, Any]:
    row = row_template(case, case.built.batch, settings.precision, "eager")
    return _guarded(row, lambda: _serve_and_check(row, case, case.built.module, settings))


def run_compile(case: Case, settings: Settings, mode: str) -> dict[str, Any]:
    row = row_template(case, case.built.batch, settings.precision, f"compile:{mode}")

    def body() -> None:
        torch._dynamo.reset()
        compiled = torch.compile(case.built.module, mode=mode)
        _serve_and_check(row, case, compiled, settings)

    return _guarded(row, body)


# ----------------------------------------------------------------------------------------------------- AOT


def aitune_available() -> str | None:
    """None when `aitune.torch` imports; otherwise the reason."""
    if importlib.util.find_spec("aitune") is None:
        return "aitune is not installed"
    try:
        import aitune.torch  # noqa: F401
    except Exception as exc:
        return f"import aitune.torch failed: {type(exc).__name__}: {exc}"
    return None


def aot_sample_dataset(case: Case, seeds: range, device: torch.device | str) -> list[Any]:
    """Unbatched samples (what `aitune.torch.tune` collates) cut from the seeded input batches."""
    samples = []
    for seed in seeds:
        batch = case.built.make_inputs(seed).to(device)
        for i in range(case.built.batch):
            if batch.kwargs:
                samples.append({k: v[i] for k, v in batch.kwargs.items()})
            else:
                samples.append(tuple(a[i] for a in batch.args))
    return samples


def aot_strategy(device: str) -> Any:
    """HighestThroughputStrategy over the torch.compile modes the suite compares against, plus eager.

    AOT is given the choices a user has with torch.compile (CUDA graphs only on CUDA), so its row shows
    whether picking per case by measured throughput lands on the best mode. On CUDA, max-autotune-no-cudagraphs
    is left out: its autotuning alone takes minutes per model on an H200 (40-60 s per convolution shape seen
    on 2026-11-21), which does not fit the suite's 10-minute runs next to its own compile:max-autotune row.
    """
    import aitune.torch as ait
    from aitune.torch.backend import TorchEagerBackend, TorchInductorBackend, TorchInductorBackendConfig

    cuda = torch.device(device).type == "cuda"
    modes = [m for m in COMPILE_MODES if (m == "reduce-overhead") == cuda or m == "default"]
    backends = [TorchInductorBackend(TorchInductorBackendConfig(mode=None if m == "default" else m)) for m in modes]
    return ait.HighestThroughputStrategy([*backends, TorchEagerBackend()])


class _SelectionLog(logging.Handler):
    """Keeps aitune's log lines that name the selected backend (the public log, not internals)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "Selected" in message or "selected" in message:
            self.lines.append(message.splitlines()[0][:300])


def run_aot(name: str, batch: int, settings: Settings) -> dict[str, Any]:
    """aitune AOT (see aot_strategy) on a freshly built copy of the model (same seed, same weights).

    The AOT wrapper replaces the module's forward, so it gets its own model object; the reference outputs
    are the suite's fp32 eager outputs (equal weights, checked by checksum). Tuning sees the served batch
    size only, so the tuned graph is static, as torch.compile's is.
    """
    row = row_template(name, batch, settings.precision, "aitune-aot")
    reason = aitune_available()
    if reason:
        return skipped(row, reason, status="not available")
    if settings.precision != "fp32":
        return skipped(row, "the bf16 comparison is the JIT (precision='bf16') against torch.compile under autocast")

    def body() -> None:
        import aitune.torch as ait

        case = make_case(name, batch, settings)
        row["model_source"] = case.built.source
        dataset = aot_sample_dataset(case, range(settings.n_inputs), settings.device)
        strategy = aot_strategy(settings.device)
        row["aot_backends"] = [b.describe() for b in strategy.backends]
        module = ait.Module(case.built.module, f"bench-{name}-b{batch}", strategy=strategy)
        selection = _SelectionLog()
        logger = logging.getLogger("aitune")
        logger.addHandler(selection)
        previous_level = logger.level
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)
        t0 = time.perf_counter()
        try:
            ait.tune(module, dataset, batch_sizes=[batch], device=settings.device)
        finally:
            logger.removeHandler(selection)
            logger.setLevel(previous_level)
        row["tune_s"] = time.perf_counter() - t0
        row["aot_selected"] = selection.lines
        _serve_and_check(row, case, module, settings)

    return _guarded(row, body)


# ------------------------------------------------------------------------------------------ subprocesses


def workload_env(extra: dict[str, str], cache_dir: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("AUTOWRAPT_BOOTSTRAP", JIT_PRECISION_ENV)}
    env.update(extra)
    if cache_dir is not None:
        env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
        env["TRITON_CACHE_DIR"] = str(cache_dir / "triton")
        env["AITUNE_JIT_CACHE_DIR"] = str(cache_dir / "aitune-jit")
    env.setdefault("PYTHONUNBUFFERED", "1")
    # `python -m benchmarks...` needs the repository root importable, wherever the suite was started from
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


def workload_command(
    name: str, batch: int, settings: Settings, contender: str, *, out_json: Path, out_pt: Path, timeout_s: float
) -> tuple[list[str], dict[str, str]]:
    """The serve.py command line of a workload contender, and the environment it adds."""
    jit = contender == "aitune-jit"
    extra: dict[str, str] = {}
    if jit:
        extra.update(JIT_ENV)
        if settings.precision == "bf16":
            extra[JIT_PRECISION_ENV] = "bf16"
    cmd = [
        sys.executable, "-m", WORKLOAD, "--model", name, "--batch", str(batch), "--device", settings.device,
        "--warmup", str(settings.warmup), "--iters", str(settings.iters), "--settle", str(settings.settle),
        "--min-timed-s", str(settings.min_timed_s),
        "--max-warmup-s", str(max(settings.max_warmup_s, timeout_s - 60)), "--n-inputs", str(settings.n_inputs),
        "--check-seeds", *map(str, settings.check_seeds), "--check-out", str(out_pt), "--out", str(out_json),
        # the JIT tunes the user's fp32 script (its precision comes from the env); the others get the autocast
        "--autocast", "none" if jit else settings.autocast,
    ]
    if settings.profile_calls > 0:
        cmd += ["--profile-calls", str(settings.profile_calls)]
    if contender.startswith("compile:") and contender.endswith(WORKLOAD_SUFFIX):
        cmd += ["--contender", contender.removesuffix(WORKLOAD_SUFFIX)]  # e.g. WORKLOAD_COMPILE
    return cmd, extra


PROFILE_KEYS = ("profile_kernels", "profile_ops", "profile_python")


def fill_profile(row: dict[str, Any], data: dict[str, Any], calls: int) -> dict[str, Any]:
    """The workload's profile tables, and per call the host and device time of the kernel-ranked one: what two
    processes of one contender that measured different latencies did differently."""
    tables = {key: data[key] for key in PROFILE_KEYS if key in data}
    if tables:
        row["profile"] = tables
        ranked = tables.get("profile_kernels") or tables.get("profile_ops") or []
        row["profile_per_call_ms"] = call_profiles.table_totals(ranked, calls)
    return row


def run_workload(
    case: Case, settings: Settings, contender: str, *, jit: bool, cache_dir: Path | None, timeout_s: float,
    tag: str,
) -> dict[str, Any]:
    """Run benchmarks/suite/workloads/serve.py in a subprocess and turn its JSON into a result row."""
    name, batch = case.built.name, case.built.batch
    row = row_template(case, batch, settings.precision, contender)
    settings.work_dir.mkdir(parents=True, exist_ok=True)
    label = slug(contender)
    stem = settings.work_dir / f"{tag}-{name}-b{batch}-{settings.precision}-{label}"
    out_json, out_pt, log = stem.with_suffix(".json.part"), stem.with_suffix(".pt"), stem.with_suffix(".log")
    cmd, extra = workload_command(name, batch, settings, contender, out_json=out_json, out_pt=out_pt,
                                  timeout_s=timeout_s)
    row["command"] = shlex.join([*(f"{k}={v}" for k, v in extra.items()), "python", *cmd[1:]])
    t0 = time.perf_counter()
    try:
        with log.open("w") as fh:
            proc = subprocess.run(cmd, env=workload_env(extra, cache_dir), stdout=fh, stderr=subprocess.STDOUT,
                                  timeout=timeout_s, check=False)
        row["wall_s"] = time.perf_counter() - t0
        row["log"] = log.name
        row["log_tail"] = _tail(log, 40)
        if jit:
            row["jit_summary"] = jit_summary(log)
        if proc.returncode != 0 or not out_json.exists():
            return skipped(row, f"workload exited with {proc.returncode}; see {log.name}", status="failed")
        data = json.loads(out_json.read_text())
        fill_serve(row, batch, data["serve"])
        row["module_call_patched"] = data["module_call_patched"]
        row["build_s"] = data["build_s"]
        row["compile_call_s"] = data.get("compile_call_s", 0.0)
        fill_profile(row, data, settings.profile_calls)
        if abs(data["weights_checksum"] - case.checksum) > 1e-6 * max(1.0, abs(case.checksum)):
            return skipped(row, f"weights differ from the suite's (checksum {data['weights_checksum']} vs "
                                f"{case.checksum})", status="failed")
        fill_check(row, torch.load(out_pt), case.reference)
        if jit and not data["module_call_patched"]:
            skipped(row, "the JIT hook did not activate (torch.nn.Module.__call__ unpatched): figures are eager",
                    status="failed")
    except subprocess.TimeoutExpired:
        row["wall_s"] = time.perf_counter() - t0
        row["log"] = log.name
        row["log_tail"] = _tail(log, 40)
        skipped(row, f"workload timed out after {timeout_s:.0f} s", status="failed")
    finally:
        for path in (out_json, out_pt):
            path.unlink(missing_ok=True)
    return row


JIT_SUMMARY_MARK = "aitune JIT tuning summary"


def jit_summary(log: Path, max_lines: int = 15) -> list[str]:
    """The summary aitune's JIT logs at exit (what was tuned, with which backend), read from the workload's log."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    for i, line in enumerate(lines):
        if JIT_SUMMARY_MARK in line:
            return [line[line.index(JIT_SUMMARY_MARK):], *(x.strip() for x in lines[i + 1:i + max_lines])]
    return []


def _tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def jit_available() -> str | None:
    """None when the env-var hook can start aitune's JIT: aitune, autowrapt and the entry point are installed.

    Checked without importing aitune, so the suite's own process stays untouched until the AOT contender.
    """
    from importlib.metadata import entry_points

    if importlib.util.find_spec("aitune") is None:
        return "aitune is not installed"
    if importlib.util.find_spec("autowrapt") is None:
        return "autowrapt is not installed (the AUTOWRAPT_BOOTSTRAP hook needs it)"
    if not list(entry_points(group="aitune_enable_jit_tuning")):
        return "no 'aitune_enable_jit_tuning' entry point (install aitune with pip, e.g. pip install -e .)"
    return None
