"""Background JIT tuning, measured from the outside: request latency while tuning runs, time-to-tuned, a warm cache.

    python -m benchmarks.probes.background_tuning --device cuda                  # GPU acceptance (resnet50, BERT)
    python -m benchmarks.probes.background_tuning --device cpu --models tiny     # a CI-sized smoke run

For each workload, fresh processes serve a fixed request stream (one request every `--interval-ms`):

- `eager`: the plain script;
- `jit-cold`: the same script under `AUTOWRAPT_BOOTSTRAP=aitune_enable_jit_tuning` with an empty JIT cache
  folder (and Inductor's cache under it): tuning runs on the background worker while requests are served;
- `jit-cold-thread`: as `jit-cold` with `AITUNE_WORKER_COMPILE=thread` (Inductor's code generation on the job
  thread instead of its compile process) and a cache folder of its own;
- `jit-cold-nostep`: as `jit-cold` with `AITUNE_WORKER_YIELD_MS=0` (the job does not step aside while a
  request is served) and a cache folder of its own;
- `jit-cold-profile`: as `jit-cold` with `AITUNE_WORKER_YIELD_GATE=profile` (the job steps aside through a
  profile function instead of the monitoring callback of Python 3.12+) and a cache folder of its own;
- `jit-cold-gcrefreeze` / `jit-cold-gcyoung` / `jit-cold-gcpause`: as `jit-cold` with `AITUNE_WORKER_GC=refreeze`
  (what survives each full collection during the job is frozen too) / `young` (no automatic full collection
  during the job, one of the job's objects at its end) / `pause` (no automatic collection during the job), each
  with a cache folder of its own;
- `jit-warm`: again, with the folder the cold run filled (a second replica, or the next deployment);
- `jit-warm-noprefetch`: as `jit-warm` with `AITUNE_WORKER_PREFETCH=off` (torch's compiler is not imported in
  the background while the script builds its model: `aitune_jit/compiler_prefetch.py`);
- `jit-warm-gated` / `jit-warm-free`: as `jit-warm` with `AITUNE_WORKER_YIELD_WARM=on` / `off` (the warm rebuild
  steps aside for requests / does not: `warm_rebuild_gate.running_freely`; by default it does on a GPU, not on the CPU);
- `jit-warm-rebuild`: as `jit-warm` with `AITUNE_WORKER_PACKAGE=off`: the decided backend is rebuilt, no
  package is loaded (with `--packages on`, the warm start from a package against the rebuild it replaces);
- `jit-blocking`: `AITUNE_JIT_BLOCKING=1`, for the steady state of the old behaviour;
- `compile-dynamic`: `torch.compile(model, dynamic=True)`, an empty Inductor cache (the reference for
  variable-length workloads);
- `compile-cold` / `compile-warm`: `torch.compile(model)` in the script, with an empty and then a filled
  Inductor cache: the first call's time is the reference for time-to-tuned.

Workloads: `resnet50-mixed` and `bert-mixed` (batches 1 and 32, three small requests then a large one), and
`bert-varlen` (batch 8, sequence length drawn from 32..128 per request). The serving script imports nothing of
aitune; to tell when the JIT switched, it reads `PatchedModule`'s state when aitune is already loaded (the env
var loaded it). Reported per run: p50 / p99 / max latency of the requests served while tuning ran (the root not
tuned yet, or the worker busy with more graphs) and after, and p99 / max of the same requests counted from when
each was due (`due_*`: the previous request's end plus its pause, or when its inputs were ready if making them
took longer than the pause - a batch-32 image copy can -; the inputs are made before that, so the wait for the GIL
on waking from the pause counts and the client's own work does not; before 2026-11-27 a request whose inputs
outlasted its pause counted their making as lateness, in eager runs too),
time-to-tuned (from the first request - for torch.compile, from the `torch.compile()` line before it, which
imports Inductor - to the end of the first request answered by a tuned root), the same from the process's
launch (`launch_to_tuned_s`: interpreter start, imports and model set-up included, so the JIT's imports at
`import torch` count as torch.compile's imports in its `torch.compile()` line do), the root's final state
(and why, when it stayed eager), outputs vs eager on fixed inputs.

With `--cudagraph-history`, the JIT's served processes record where each tensor of a CUDA-graph pool was
allocated (`torch._inductor.config.triton.cudagraph_trees_history_recording`, which imports Inductor before the
first request) and keep the whole text of each failed pool check (`cudagraph_pool_failures`): the reduce-overhead
candidate's intermittent "Detected N tensor(s) in the cudagraph pool not tracked as outputs".

Where a slow request waited: a watchdog thread in the served process samples the Python stacks of the main
thread and of aitune's tuning thread while a request runs longer than `--stall-ms`, and `gc.callbacks` time
every garbage collection; the slowest requests' samples and the long collections are in the results.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from benchmarks import common
from benchmarks.probes.background_tuning_report import print_table, ratios, summarize
from benchmarks.probes.job_profile import JobProfile

#: when this module was imported (after torch): a served process's set-up before its first request is measured
#: from here (`setup_s`: the model built and moved to its device, what a compiler prefetch overlaps)
IMPORTED_AT = time.perf_counter()

WORKLOADS = {
    "gpu": {"resnet50-mixed": ("resnet50", "mixed"), "bert-mixed": ("bert_base", "mixed"),
            "bert-varlen": ("bert_base", "varlen")},
    "tiny": {"resnet50-mixed": ("tiny_resnet", "mixed"), "bert-varlen": ("tiny_bert", "varlen")},
}
#: contenders that run `jit-cold` with another collector policy of the worker (`AITUNE_WORKER_GC`)
GC_CONTENDERS = {"jit-cold-gcrefreeze": "refreeze", "jit-cold-gcyoung": "young", "jit-cold-gcpause": "pause"}
CONTENDERS = ("eager", "jit-cold", "jit-cold-thread", "jit-cold-nostep", "jit-cold-profile", *GC_CONTENDERS,
              "jit-warm", "jit-warm-noprefetch", "jit-warm-gated", "jit-warm-free",
              "jit-warm-rebuild", "jit-blocking", "compile-cold",
              "compile-warm", "compile-dynamic")
CHECK_SEEDS = (1000, 1001)
#: frames kept per sampled stack (innermost last)
STACK_DEPTH = 8


# ----------------------------------------------------------------------------------------------- the served script
def _inputs(model_name: str, module: torch.nn.Module, batch: int, seq: int, seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    if "bert" in model_name:
        ids = torch.randint(1, module.config.vocab_size, (batch, seq), generator=g)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    size = 224 if model_name == "resnet50" else 32
    return {"x": torch.randn(batch, 3, size, size, generator=g)}


def _shape(schedule: str, index: int, rng: torch.Generator, longest: int = 128) -> tuple[int, int]:
    """(batch, sequence length) of request `index`; lengths stop at `longest` (a tiny BERT has 64 positions)."""
    if schedule == "mixed":
        return (32 if index % 4 == 3 else 1), min(128, longest)
    return 8, int(torch.randint(32, min(128, longest) + 1, (1,), generator=rng))


def _root_node(module: torch.nn.Module) -> Any:
    jit = sys.modules.get("aitune_jit.patched_module")
    return jit.PatchedModule.of(module) if jit is not None else None


def _root_tuned(module: torch.nn.Module) -> bool:
    node = _root_node(module)
    return node is not None and node.state.value == "tuned"


def _misses(module: torch.nn.Module) -> int:
    """Calls the tuned root sent to the original module so far (its shapes outside the tuned ranges)."""
    node = _root_node(module)
    dispatcher = getattr(node, "_dispatcher", None) if node is not None else None
    return int(getattr(dispatcher, "misses", 0))


def _backends(module: torch.nn.Module) -> list[str]:
    """The tuned root's backends with their graphs' ranges (empty without aitune or before tuning)."""
    node = _root_node(module)
    entries = getattr(node, "_entries", None) or []
    ranges = [[(t.min_shape, t.max_shape) for t in spec.input_spec.tensors] for spec, _ in entries]
    return [f"graph {spec.name}: {backend.describe()} over {r}" for (spec, backend), r in zip(entries, ranges)]


def _worker_busy() -> bool:
    """True while aitune's background worker has a job running or queued (False without aitune)."""
    worker = sys.modules.get("aitune_jit.worker")
    return worker is not None and bool(worker.pending())


def _stack(frame: Any) -> list[str]:
    return [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in traceback.extract_stack(frame)[-STACK_DEPTH:]]


class StallSampler:
    """Samples where the main thread and the tuning thread are while a request runs longer than `stall_s`, and
    times garbage collections; a daemon thread that wakes every `period_s`."""

    def __init__(self, stall_s: float, period_s: float = 0.01) -> None:
        self.stall_s, self.period_s = stall_s, period_s
        self.current: tuple[int, float] | None = None  # (request index, begin), set by the serving loop
        self.samples: dict[int, list[dict[str, Any]]] = {}
        self.collections: list[dict[str, Any]] = []
        self._gc_began: float | None = None
        self._main = threading.main_thread().ident
        self._origin = time.perf_counter()
        gc.callbacks.append(self._on_gc)
        threading.Thread(target=self._loop, name="stall-sampler", daemon=True).start()

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_began = time.perf_counter()
        elif self._gc_began is not None:
            took = time.perf_counter() - self._gc_began
            if took > 0.005:
                self.collections.append({"t": self._gc_began - self._origin, "ms": 1e3 * took,
                                         "generation": info.get("generation"), "collected": info.get("collected"),
                                         "frozen": gc.get_freeze_count(),
                                         "thread": threading.current_thread().name})

    def _loop(self) -> None:
        while True:
            time.sleep(self.period_s)
            current = self.current
            if current is None or time.perf_counter() - current[1] < self.stall_s:
                continue
            kept = self.samples.setdefault(current[0], [])
            if len(kept) >= 3:
                continue
            frames = sys._current_frames()
            tuning = [t.ident for t in threading.enumerate() if t.name.startswith("aitune-tuning-job")]
            kept.append({"after_ms": 1e3 * (time.perf_counter() - current[1]),
                         "main": _stack(frames[self._main]) if self._main in frames else [],
                         "tuning": _stack(frames[tuning[0]]) if tuning and tuning[0] in frames else []})


def request_due(scheduled: float, inputs_ready: float) -> float:
    """When a request is due: its scheduled time (the previous one's end plus the pause), or when its inputs were
    ready if making them took longer than the pause - the client's own work is not the server's latency."""
    return max(scheduled, inputs_ready)


def serve(options: argparse.Namespace) -> int:
    from benchmarks.suite import models

    device = torch.device(options.device)
    module = models.build(options.model, 1).module.to(device)
    # the clock starts before `torch.compile()`: that line imports Inductor (seconds on a GPU machine), a cost the
    # script pays for torch.compile as the JIT pays it on its worker
    pool_failures = _watch_cudagraph_pool() if options.cudagraph_history else []
    frozen_at_start = gc.get_freeze_count()  # (objects frozen before the first request: not by a tuning job)
    start = time.perf_counter()
    start_wall = time.time()  # (the driver's launch time is on the same wall clock: `launch_to_start_s`)
    setup_s = start - IMPORTED_AT
    target = torch.compile(module, dynamic=options.compile == "dynamic") if options.compile else module
    compile_call_s = time.perf_counter() - start
    positional = "x" in _inputs(options.model, module, 1, 8, 0)

    def call(kwargs: dict[str, Any]) -> Any:
        return target(kwargs["x"]) if positional else target(**kwargs)

    longest = getattr(getattr(module, "config", None), "max_position_embeddings", 128)
    sampler = StallSampler(options.stall_ms / 1000)
    profile = JobProfile(options.job_profile_ms / 1000, _job_phase).start() if options.job_profile_ms > 0 else None
    rng = torch.Generator().manual_seed(7)
    rows = []
    steady_from = None  # the first request after the root is tuned and the worker has nothing left to do
    due = None  # when the request is due: the end of the previous one plus its pause (`late_s`)
    with torch.no_grad():
        for index in range(options.requests):
            batch, seq = _shape(options.schedule, index, rng, longest)
            kwargs = {k: v.to(device) for k, v in _inputs(options.model, module, batch, seq, index % 8).items()}
            if due is not None:
                due = request_due(due, time.perf_counter())
                time.sleep(max(0.0, due - time.perf_counter()))
            begin = time.perf_counter()
            late = max(0.0, begin - due) if due is not None else 0.0
            sampler.current = (index, begin)
            misses = _misses(module)
            phase = _job_phase()
            call(kwargs)
            if device.type == "cuda":
                torch.cuda.synchronize()
            latency = time.perf_counter() - begin
            tuned_call = (_root_tuned(module) and _misses(module) == misses) or bool(options.compile)
            sampler.current = None
            tuned = _root_tuned(module) or bool(options.compile)
            busy = _worker_busy()
            rows.append({"t": begin - start, "latency_s": latency, "late_s": late, "batch": batch, "seq": seq,
                         "tuned": tuned, "tuning": busy or not tuned, "served_tuned": tuned_call,
                         "phase": phase or _job_phase()})
            if tuned and not busy and steady_from is None:
                steady_from = index
            if steady_from is not None and index - steady_from >= options.after:
                break
            due = time.perf_counter() + max(0.0, options.interval_ms / 1000 - latency)
        checks = []
        for seed in CHECK_SEEDS:
            out = call({k: v.to(device) for k, v in _inputs(options.model, module, 4, 64, seed).items()})
            tensor = out if isinstance(out, torch.Tensor) else out[0]
            checks.append(tensor.float().cpu())
    torch.save(checks, options.check_out)
    node = _root_node(module)
    slowest = sorted(sampler.samples, key=lambda i: -rows[i]["latency_s"] if i < len(rows) else 0)[:8]
    Path(options.out).write_text(json.dumps({
        "rows": rows, "compile_call_s": compile_call_s, "setup_s": setup_s, "start_wall": start_wall,
        "frozen_at_start": frozen_at_start,
        "root_state": node.state.value if node is not None else None,
        "root_reason": node.reason if node is not None else None, "backends": _backends(module),
        "stalls": [{"request": i, "latency_ms": 1e3 * rows[i]["latency_s"], "samples": sampler.samples[i]}
                   for i in slowest if i < len(rows)],
        "long_collections": sorted(sampler.collections, key=lambda c: -c["ms"])[:10],
        "cudagraph_pool_failures": pool_failures,
        "job_profile": profile.summary() if profile is not None and profile.samples else None,
    }))
    return 0


def _watch_cudagraph_pool() -> list[str]:
    """Allocation histories on, and the full text of every failed pool check kept (`--cudagraph-history`)."""
    import torch._inductor.cudagraph_trees as trees
    from torch._inductor import config

    config.triton.cudagraph_trees_history_recording = True
    failures: list[str] = []
    check = trees.check_memory_pool

    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            return check(*args, **kwargs)
        except Exception as exc:
            failures.append(f"{threading.current_thread().name}: {type(exc).__name__}: {exc}"[:12000])
            raise

    trees.check_memory_pool = checked
    return failures


def _job_phase() -> str | None:
    """The step the background job's strategy is in ("Building ...", "Validating ...", "Profiling ..."), as the
    request starts (or, if none then, as it ends); None outside the strategy's steps or without aitune."""
    progress = sys.modules.get("aitune_core.strategies.progress")
    current = getattr(progress, "current_phase", None)  # (None while the job thread is still importing it)
    return current() if current is not None else None


# ----------------------------------------------------------------------------------------------- the driver
def _run(contender: str, model: str, schedule: str, args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AITUNE_JIT_", "TORCHINDUCTOR_CACHE_DIR"))}
    env.pop("AUTOWRAPT_BOOTSTRAP", None)
    env["PYTHONFAULTHANDLER"] = "1"  # a process killed by a signal prints every thread's Python stack
    jit_cache = scratch / f"{model}-{schedule}-jit"
    if contender.startswith("jit"):
        env.update(AUTOWRAPT_BOOTSTRAP="aitune_enable_jit_tuning", AITUNE_JIT_CACHE_DIR=str(jit_cache),
                   AITUNE_JIT_PRINT_HISTORY="1")
        env["AITUNE_WORKER_PACKAGE"] = "off" if contender == "jit-warm-rebuild" else args.packages
        if contender == "jit-warm-noprefetch":
            env["AITUNE_WORKER_PREFETCH"] = "off"
        if contender in ("jit-warm-gated", "jit-warm-free"):
            env["AITUNE_WORKER_YIELD_WARM"] = "on" if contender == "jit-warm-gated" else "off"
        if contender == "jit-blocking":
            env.update(AITUNE_JIT_CACHE_DIR=str(scratch / f"{model}-{schedule}-blocking"), AITUNE_JIT_BLOCKING="1")
        if contender == "jit-cold-nostep":
            env.update(AITUNE_JIT_CACHE_DIR=str(scratch / f"{model}-{schedule}-nostep"), AITUNE_WORKER_YIELD_MS="0")
        if contender == "jit-cold-thread":
            env.update(AITUNE_JIT_CACHE_DIR=str(scratch / f"{model}-{schedule}-thread"), AITUNE_WORKER_COMPILE="thread")
        if contender in GC_CONTENDERS:
            env.update(AITUNE_JIT_CACHE_DIR=str(scratch / f"{model}-{schedule}-{contender}"),
                       AITUNE_WORKER_GC=GC_CONTENDERS[contender])
        if contender == "jit-cold-profile":
            env.update(AITUNE_JIT_CACHE_DIR=str(scratch / f"{model}-{schedule}-profile"),
                       AITUNE_WORKER_YIELD_GATE="profile")
    if contender.startswith("compile"):  # compile-warm reuses compile-cold's cache; compile-dynamic has its own
        suffix = "-dynamic" if contender == "compile-dynamic" else ""
        env["TORCHINDUCTOR_CACHE_DIR"] = str(scratch / f"{model}-{schedule}-inductor{suffix}")
    out, check = scratch / f"{contender}.json", scratch / f"{contender}.pt"
    # eager never switches: it serves as many requests as the others serve after their switch
    requests = args.after + 50 if contender == "eager" else args.requests
    command = [sys.executable, "-m", "benchmarks.probes.background_tuning", "--serve", "--model", model,
               "--schedule", schedule, "--device", args.device, "--requests", str(requests), "--after",
               str(args.after), "--interval-ms", str(args.interval_ms), "--stall-ms", str(args.stall_ms),
               "--job-profile-ms", str(getattr(args, "job_profile_ms", 10.0)), "--out", str(out),
               "--check-out", str(check)]
    if getattr(args, "cudagraph_history", False) and contender.startswith("jit"):
        command.append("--cudagraph-history")
    if contender.startswith("compile"):
        command += ["--compile", "dynamic" if contender == "compile-dynamic" else "default"]
    began, launched_wall = time.perf_counter(), time.time()
    try:
        result = subprocess.run(command, env=env, cwd=common.REPO, capture_output=True, text=True,
                                timeout=args.timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {args.timeout_s:g}s"}
    if not out.exists():  # (the first traceback, if any, says more than the history printed after it)
        traceback_at = result.stderr.find("Traceback (most recent call last)")
        first = result.stderr[traceback_at:traceback_at + 4000] + "\n...\n" if traceback_at >= 0 else ""
        return {"error": first + (result.stderr[-2000:] or f"exit status {result.returncode}"),
                "exit_status": result.returncode}
    data = json.loads(out.read_text())  # written before exit: a crash at exit is reported, not hidden
    data["wall_s"] = time.perf_counter() - began
    if "start_wall" in data:
        data["launch_to_start_s"] = data["start_wall"] - launched_wall
    data["stderr_lines"] = len(result.stderr.splitlines())
    data["summary"] = [line for line in result.stderr.splitlines() if "aitune" in line or line.startswith("  ")][-40:]
    data["history"] = _history(result.stderr)
    data["exit_status"] = result.returncode
    if result.returncode != 0:  # (killed by a signal: the faulthandler's stacks, which are longer)
        data["stderr_tail"] = result.stderr[-(12000 if result.returncode < 0 else 1000):]
    data["checks"] = torch.load(check)
    return data


def _history(stderr: str, limit: int = 60) -> list[str]:
    """The JIT's history (`AITUNE_JIT_PRINT_HISTORY`) without the lines about each module seen or skipped: what
    was tuned, reused, warm-started or packaged, and how long each took."""
    lines = stderr.split("JIT Tuning History:", 1)[1].splitlines() if "JIT Tuning History:" in stderr else []
    noise = ("child module", "Skipping", "New top module")
    return [line for line in lines if line.strip() and not any(word in line for word in noise)][:limit]


def drive(args: argparse.Namespace) -> int:
    header = common.environment("background_tuning", args.device, args.git_commit)
    results: dict[str, Any] = {**header, "interval_ms": args.interval_ms, "workloads": {}}
    for name, (model, schedule) in WORKLOADS[args.models].items():
        if args.only and name not in args.only:
            continue
        raw: dict[str, dict[str, Any]] = {c: {"error": "not run"} for c in CONTENDERS}
        with tempfile.TemporaryDirectory(prefix="aitune-bg-") as tmp:
            for contender in CONTENDERS:
                if contender in args.contenders:
                    raw[contender] = _run(contender, model, schedule, args, Path(tmp))
                    _keep(results, name, raw, header, args)  # a run cut short still leaves what it measured
        rows, ratio = _keep(results, name, raw, header, args)
        print_table(name, rows, ratio)
    return 0


def _keep(results: dict[str, Any], name: str, raw: dict[str, dict[str, Any]], header: dict[str, Any],
          args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, float | None]]:
    """Summarize the contenders run so far and write the results file."""
    rows = {c: summarize(raw[c], raw["eager"]) for c in CONTENDERS}
    ratio = ratios(rows, raw["eager"].get("rows", []))
    results["workloads"][name] = {**rows, "ratios": ratio}
    common.write_result(common.result_path(header, args.models, *(args.only or ()), out=args.out), results)
    return rows, ratio


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model")
    p.add_argument("--schedule", choices=["mixed", "varlen"], default="mixed")
    p.add_argument("--compile", choices=["default", "dynamic"], default=None)
    p.add_argument("--check-out")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", choices=sorted(WORKLOADS), default="gpu")
    p.add_argument("--only", nargs="*", help="workload names to run (default: all of --models)")
    p.add_argument("--requests", type=int, default=3000, help="at most this many requests per run")
    p.add_argument("--after", type=int, default=200, help="requests served after the root is tuned")
    p.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS),
                   help="run only these (eager is the reference of every ratio; jit-warm reuses jit-cold's cache)")
    p.add_argument("--interval-ms", type=float, default=20.0)
    p.add_argument("--packages", choices=["off", "on", "dynamo", "aoti"], default="off",
                   help="AITUNE_WORKER_PACKAGE of the JIT contenders: warm starts from packages (on = dynamo: "
                        "precompiled functions; aoti: AOTInductor packages)")
    p.add_argument("--stall-ms", type=float, default=50.0, help="sample stacks of requests slower than this")
    p.add_argument("--job-profile-ms", type=float, default=10.0,
                   help="sample aitune's job threads this often for a flat profile of the job (0: off)")
    p.add_argument("--timeout-s", type=float, default=1800.0)
    p.add_argument("--cudagraph-history", action="store_true",
                   help="JIT contenders record CUDA-graph pool allocation histories and keep failed pool checks "
                        "(a diagnostic: with it, 2 of 5 ResNet-50 processes on an H200 ended without a result)")
    args = p.parse_args(argv)
    if args.serve:
        if args.model is None:
            p.error("--serve needs --model")
        return serve(args)
    return drive(args)


if __name__ == "__main__":
    raise SystemExit(main())
