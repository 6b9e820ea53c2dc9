"""Warm starts from packages: a later process serves a tuned graph seconds after its first calls, without dynamo.

Why: a process that reuses a stored decision (`decisions.py`) still builds the decided backend again; for
Inductor that is dynamo's trace and the loading of cached code, seconds of the GIL on the job thread, which the
worker can only spend between requests (on an H100, ResNet-50 took 22 s to tuned with a warm cache against 3.75 s
for torch.compile's first call with warm Inductor caches). A package of the graph loads without a trace. Two kinds
(`AITUNE_WORKER_PACKAGE`):

- `dynamo` (also `on`): the whole compiled function as torch saves it (`aot_compile`; `packages/<key>.<build>.aotc`,
  made in the job thread by `aitune_core.precompiling`, served by `PrecompiledBackend`): a dynamo trace to make
  (Inductor's caches are warm from tuning), no C++ toolchain; on an H100, ResNet-50 loaded in 2.9 s;
- `aoti`: an AOTInductor package (`packages/<key>.<build>.pt2`, exported on the job thread and compiled in a child
  process by `aitune_core.aoti_packaging`, served by `AOTIPackageBackend`): a C++ build of minutes on a GPU host.

- Making (`make_next`, a follow-up job of the process that tuned, `follow_ups.py`): after a graph's decision is
  taken and applied, the worker makes the package, loads it and validates it on the node's samples, then records
  it in the decision (a file name per build, and its SHA-256). A decision that already has a package (another
  replica made it, of either kind) is left alone. Failures are logged in the history; the decision stays as it
  was.
- Warm start (`warm_starts`, in the tuning of a later process): a graph whose decision has a package is served by
  the package's backend once the package is loaded and validated on this process's own samples; the graph is then
  owed an upgrade: the next job builds the decided backend (which may use CUDA graphs) and it replaces the package;
  if it cannot be built here, the package keeps serving and nothing is stored (`keep_packages`).
  A package that is missing, damaged (its digest differs) or fails validation is ignored with one WARNING, and the
  decision is built as before.

Opt-in (default `off`): loading either kind runs code from the cache folder (a `dynamo` package is a pickle
that holds Python bytecode, an `aoti` one a shared library), which the decisions never do; give that folder the
trust you give torch's own Inductor cache. Never with `jit_config.blocking` (the job would block a call),
`dry_run`, or without `reuse_decisions`. `aoti` on the H100 this project measures on (torch 2.11, CUDA 13):
compiling a package took 78 s for a two-layer MLP and 99 s for ResNet-50 (the C++ wrapper's build), and loading
any package killed the loading process with SIGSEGV; the compile process verifies each package by loading and
running it itself (`aitune_core.aoti_compile_process`), so there such a package is never published.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
import uuid
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from aitune_core.decision_store import PACKAGES
from aitune_core.specs.replay_state import replaying
from aitune_jit import decisions
from aitune_jit.config import jit_config
from aitune_jit.node_registry import registry
from aitune_jit.outcome import OutcomeDraft, TuningOutcome, Verdict, release_backend
from aitune_jit.warm_rebuild_gate import running_freely
from aitune_jit.worker import abandoned
from aitune_jit.worker_env import env_choice

if TYPE_CHECKING:
    import torch

    from aitune_core.backends.backend import Backend
    from aitune_core.decision_store import Decision
    from aitune_core.recording.sample import Sample
    from aitune_core.specs.graph_spec import GraphSpec
    from aitune_jit.outcome import TuningNode

_logger = logging.getLogger("aitune.jit")
CHOICES = ("off", "on", "dynamo", "aoti")
#: file suffix -> what the history calls a package of that kind
SUFFIXES = {".aotc": "precompiled package", ".pt2": "AOTInductor package"}
_warned: set[str] = set()
_warned_lock = threading.Lock()


def enabled(device: torch.device) -> bool:
    """Whether graphs tuned on `device` get packages and warm starts from them (see the module docstring; the
    device is for a per-device default, none yet)."""
    if jit_config.blocking or jit_config.dry_run or not jit_config.reuse_decisions:
        return False
    return kind() != "off"


def kind() -> str:
    """`off`, `dynamo` or `aoti` (see the module docstring; `on` is `dynamo`)."""
    choice = env_choice("AITUNE_WORKER_PACKAGE", CHOICES, "off")
    return "dynamo" if choice == "on" else choice


def label(decision: Decision) -> str:
    """What the history calls the decision's package ("precompiled package", "AOTInductor package")."""
    return SUFFIXES.get(Path(decision.package or "").suffix, "package")


def own_package_name(decision: Decision) -> bool:
    """Whether the decision names a package file of its own key (`<key>.<build>.pt2` or `.aotc`, in the packages
    folder)."""
    name = decision.package or ""
    return (name.startswith(f"{decision.key}.") and Path(name).suffix in SUFFIXES and "/" not in name
            and "\\" not in name)


def package_path(decision: Decision) -> Path | None:
    """Where the decision's package lies; None when it has none or names another file than one of its own key."""
    if not own_package_name(decision) or not decision.package_sha256:
        return None
    return Path(jit_config.cache_dir) / PACKAGES / str(decision.package)


def _warn_once(key: str, message: str) -> None:
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    _logger.warning("aitune: %s", message)


def _load(decision: Decision, proxy: torch.nn.Module, spec: GraphSpec, samples: list[Sample],
          device: torch.device) -> Backend:
    """The decision's package, loaded for this node and validated on its samples (raises on any failure)."""
    from aitune_core.validation.validator import validate_backend

    path = package_path(decision)
    if path is None:
        raise ValueError("the decision names no package of its own")
    backend = _package_backend(path, str(decision.package_sha256))
    backend.build(proxy, spec, samples, device, path.parent)
    try:
        validate_backend(backend, spec, samples)
    except BaseException:
        release_backend(backend)
        raise
    return backend


def _package_backend(path: Path, sha256: str) -> Backend:
    if path.suffix == ".aotc":
        from aitune_core.backends.precompiled import PrecompiledBackend, PrecompiledBackendConfig

        return PrecompiledBackend(PrecompiledBackendConfig(artifact=str(path), sha256=sha256))
    from aitune_core.backends.aoti_package import AOTIPackageBackend, AOTIPackageBackendConfig

    return AOTIPackageBackend(AOTIPackageBackendConfig(package=str(path), sha256=sha256))


def warm_starts(
    node: TuningNode, proxy: torch.nn.Module, graphs: list[GraphSpec], samples: dict[str, list[Sample]],
    keys: dict[str, str], device: torch.device, draft: OutcomeDraft,
) -> None:
    """Serve the graphs whose decisions have a package from it (removed from `graphs`, owed an upgrade)."""
    if not enabled(device):
        return
    for spec in list(graphs):
        key = keys.get(spec.name)
        if key is None or spec.name in node.upgrade_due:  # this job is the upgrade: build the decided backend
            continue
        found = decisions.lookup(key)
        if found is None or found[0].kind != "backend" or not found[0].package:
            continue
        decision, origin = found
        start = time.perf_counter()
        try:
            with running_freely(device.type):  # (a load: short, like a warm rebuild)
                backend = _load(decision, proxy, spec, samples[spec.name], device)
        except Exception as exc:
            _warn_once(f"{key}:{package_path(decision)}",
                       f"ignoring the {label(decision)} of {decision.source} from {origin} for {node.short} graph "
                       f"{spec.name} ({type(exc).__name__}: {exc}); building {decision.describe()} instead")
            continue
        from aitune_core.strategies.strategy import TuneReport

        registry.log(f"{node.short} graph {spec.name}: warm start from the {label(decision)} of {decision.source} "
                     f"in {time.perf_counter() - start:.2f}s (loaded and validated); {decision.describe()} is "
                     "built next and replaces it")
        draft.entries.append((spec, backend))
        draft.reports.append(TuneReport(backend=backend, strategy="warm start from a package"))
        draft.upgrade_due.add(spec.name)
        graphs.remove(spec)


def keep_packages(node: TuningNode, graphs: list[GraphSpec]) -> None:
    """Graphs whose upgrade found no decided backend to build (the decision failed here): they keep their package;
    tuning them from scratch would store its verdict over a decision that holds elsewhere."""
    for spec in [spec for spec in graphs if spec.name in node.upgrade_due]:
        graphs.remove(spec)
        registry.log(f"{node.short} graph {spec.name}: the decided backend could not be built here; the package "
                     "keeps serving it")


def owed(outcome: TuningOutcome, keys: dict[str, str], device: torch.device) -> TuningOutcome:
    """`outcome` with the packages it owes: its graphs served by a backend other than a package, whose decision
    has no package yet."""
    if outcome.verdict is not Verdict.TUNED or not enabled(device):
        return outcome
    from aitune_core.backends.aoti_package import AOTIPackageBackend
    from aitune_core.backends.precompiled import PrecompiledBackend

    due = {}
    for spec, backend in outcome.entries:
        key = keys.get(spec.name)
        if key is None or isinstance(backend, (AOTIPackageBackend, PrecompiledBackend)):
            continue
        found = decisions.lookup(key)
        if found is not None and found[0].kind == "backend" and not found[0].package:
            due[spec.name] = (key, spec)
    return dataclasses.replace(outcome, package_due=MappingProxyType(due)) if due else outcome


def make_next(node: TuningNode, device: torch.device) -> TuningOutcome:
    """Make one package the node owes (see the module docstring); the outcome notes it as made, whatever came of
    it."""
    name, (key, spec) = next(iter(node.package_due.items()))
    draft = OutcomeDraft()
    draft.packaged.add(name)
    stored = decisions.store().get(key)  # the store, not this process's memory: another replica may have made it
    known = stored or (found[0] if (found := decisions.lookup(key)) is not None else None)
    recorder, module = node.recorder, node.module
    if known is None or known.kind != "backend" or recorder is None or module is None:
        return draft.finish()
    if known.package and (path := package_path(known)) is not None and path.is_file():
        return draft.finish()
    samples = recorder.samples(spec)
    try:
        decision = _package(node, known, spec, samples, device)
    except Exception as exc:
        what = "precompiled package" if kind() == "dynamo" else "AOTInductor package"
        registry.log(f"{node.short} graph {name}: no {what} for warm starts ({type(exc).__name__}: "
                     f"{str(exc).strip().splitlines()[-1] if str(exc).strip() else exc})")
        _logger.debug("packaging %s failed", node.path, exc_info=True)
        return draft.finish()
    decisions.remember(key, decision)
    return draft.finish()


def _package(node: TuningNode, decision: Decision, spec: GraphSpec, samples: list[Sample],
             device: torch.device) -> Decision:
    """Make (see the module docstring), load and validate; the decision with its package recorded."""
    start = time.perf_counter()
    precompiled = kind() == "dynamo"
    # a name per build: replicas packaging the same decision never replace each other's file (builds differ)
    build = f"{decision.key}.{os.getpid()}-{uuid.uuid4().hex[:8]}"
    dest = Path(jit_config.cache_dir) / PACKAGES / f"{build}{'.aotc' if precompiled else '.pt2'}"
    if precompiled:
        from aitune_core.precompiling import make_precompiled

        digest = make_precompiled(node.tuning_view(), spec, samples, device, dest)
    else:
        from aitune_core.aoti_packaging import compile_package

        timeout = jit_config.tuning_timeout_s  # the job's own limit: the compile gets most of it, the rest is export
        with replaying(spec):  # exported as the program calls the graph (the load validates it)
            digest = compile_package(node.tuning_view(), spec, samples, device, dest,
                                     timeout_s=1800.0 if timeout is None else 0.8 * float(timeout),
                                     should_stop=abandoned)
    made = dataclasses.replace(decision, package=dest.name, package_sha256=digest)
    try:
        release_backend(_load(made, node.tuning_view(), spec, samples, device))
    except BaseException:
        dest.unlink(missing_ok=True)  # a package that fails here is not published
        raise
    size = dest.stat().st_size / (1 << 20)
    registry.log(f"{node.short} graph {spec.name}: {label(made)} for warm starts made in "
                 f"{time.perf_counter() - start:.1f}s ({size:.1f} MiB, {dest})")
    return made
