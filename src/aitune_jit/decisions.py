"""Tuning decisions reused by identical modules of this process and by later processes.

When a graph of a node is ready, its decision key (`aitune_core.decision_key`: module structure, graph spec,
strategy and candidates, environment) is looked up, first among the decisions taken in this process (the
16 identical blocks of a transformer: the first is tuned, the others reuse its decision), then in the
persistent store under `jit_config.cache_dir` (`aitune_core.decision_store`). A hit skips the graph-break
probe and every losing candidate:

- "backend": only the chosen backend is built (for Inductor, torch's FX graph cache makes that cheap) and
  validated against this node's own recorded samples; a failed build or validation falls back to normal tuning.
- "eager": the node stays eager for the same reason, its children open or not as the decision says.

`jit_config.reuse_decisions = False` turns both off (every module is tuned from scratch, nothing is written).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aitune_core.decision_key import decision_key
from aitune_core.decision_store import INDUCTOR, INDUCTOR_MARKER, Decision, DecisionStore
from aitune_core.specs.replay_state import describe_replay_state
from aitune_jit.config import jit_config
from aitune_jit.node_registry import registry
from aitune_jit.outcome import TuningOutcome
from aitune_jit.warm_rebuild_gate import running_freely
from aitune_jit.worker import abandoned

if TYPE_CHECKING:
    import torch

    from aitune_core.backends.backend import Backend
    from aitune_core.recording.sample import Sample
    from aitune_core.specs.graph_spec import GraphSpec
    from aitune_core.strategies.strategy import TuneReport
    from aitune_jit.outcome import OutcomeDraft, TuningNode

_logger = logging.getLogger("aitune.jit")
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"

_memory: dict[str, Decision] = {}
_environments: dict[str, dict[str, str]] = {}  # key -> the environment part of that key (for `cache list`)
_lock = threading.Lock()


def reset() -> None:
    """Forget the decisions taken in this process (the persistent store is untouched)."""
    with _lock:
        _memory.clear()
        _environments.clear()


def store() -> DecisionStore:
    return DecisionStore(jit_config.cache_dir)


_pointed: str | None = None  # the folder `point_inductor_cache` last set


def point_inductor_cache() -> None:
    """Inductor's caches go under the aitune cache folder (so that replicas sharing that folder share compiled
    kernels, and `cache clear` clears them), unless someone chose their folder: TORCHINDUCTOR_CACHE_DIR is
    left alone unless it is unset or torch's own default (torch writes its default into the variable when
    dynamo is first imported)."""
    global _pointed
    if not jit_config.reuse_decisions:
        return
    current = os.environ.get(INDUCTOR_CACHE_ENV)
    if current is not None and current != _pointed:  # (aitune's own earlier choice follows a new cache_dir)
        try:
            from torch._inductor.runtime.cache_dir_utils import default_cache_dir

            if os.path.abspath(current) != os.path.abspath(default_cache_dir()):
                return
        except Exception:  # a torch without that helper: leave the variable alone
            return
    target = str(Path(jit_config.cache_dir).absolute() / INDUCTOR)
    if any(character.isspace() for character in target):
        _warn_unpointed(target)
        return
    _pointed = target
    if current != _pointed:
        os.environ[INDUCTOR_CACHE_ENV] = _pointed
    with contextlib.suppress(OSError):  # (`cache clear` removes a folder marked as aitune's only)
        Path(target).mkdir(parents=True, exist_ok=True)
        (Path(target) / INDUCTOR_MARKER).touch()


def _warn_unpointed(target: str) -> None:
    """Inductor's C++ builds pass its cache folder to the compiler unquoted: under a folder whose path holds a
    space every CPU build failed ("CppCompileError"), and the failure was stored as each module's decision (a
    reviewer's `AITUNE_JIT_CACHE_DIR="/tmp/x/with space"`). Inductor then keeps its own default folder."""
    global _unpointed_warned
    if not _unpointed_warned:
        _unpointed_warned = True
        _logger.warning("aitune: the JIT cache folder %r has a space in its path, which Inductor's C++ builds cannot "
                        "take; Inductor's own caches stay in their default folder (decisions are still kept there)",
                        str(Path(target).parent))


_unpointed_warned = False


def keys_for(node: TuningNode, graphs: list[GraphSpec], strategy: Any, device: torch.device) -> dict[str, str]:
    """Decision key per graph name (empty when reuse is off or a key cannot be computed)."""
    module = node.module
    if not jit_config.reuse_decisions or module is None:
        return {}
    keys = {}
    for spec in graphs:
        try:
            key, parts = decision_key(module, spec, strategy, device)
            keys[spec.name] = key
            _environments[key] = parts["environment"]
        except Exception:  # an odd module (e.g. a parameter without a shape): tuned normally
            _logger.debug("no decision key for %s graph %s", node.path, spec.name, exc_info=True)
    return keys


def lookup(key: str) -> tuple[Decision, str] | None:
    """The decision for `key` and where it came from ("this process" or the store's file), or None."""
    with _lock:
        decision = _memory.get(key)
    if decision is not None:
        return decision, "this process"
    try:
        decision = store().get(key)
    except Exception:
        _logger.debug("cannot read the decision store", exc_info=True)
        return None
    if decision is None:
        return None
    with _lock:
        _memory.setdefault(key, decision)
    return decision, f"the cache ({store().path(key)})"


def remember(key: str | None, decision: Decision, *, persist: bool = True) -> None:
    """Keep a decision for identical modules and, with `persist`, publish it to the store (never raises)."""
    if key is None or not jit_config.reuse_decisions or abandoned():  # a cut-short job decides nothing
        return
    decision.environment = decision.environment or _environments.get(key, {})
    with _lock:
        _memory[key] = decision
    if not persist:
        return
    try:
        store().put(decision)
    except Exception as exc:  # a read-only or full disk: reuse in this process still works
        _logger.debug("cannot write decision %s (%r)", key, exc)


def remember_backend(key: str | None, node: TuningNode, spec: GraphSpec, report: TuneReport) -> None:
    backend = report.backend
    if key is None:
        return
    try:
        config = backend.config.to_dict()
        decision = Decision(
            key=key, kind="backend", backend_type=type(backend).__name__, backend_config=config,
            backend_path=f"{type(backend).__module__}.{type(backend).__qualname__}",
            backend_description=backend.describe(), source=node.path, speedup=report.speedup,
            module=node.short, graph=graph_label(spec), validated_samples=_validated_count(node, spec),
        )
    except Exception:  # a config that is not plain data: not reusable
        _logger.debug("decision of %s not kept", node.path, exc_info=True)
        return
    remember(key, decision)


def remember_eager(
    key: str | None, node: TuningNode, spec: GraphSpec, reason: str, *, reopen: bool, persist: bool = True
) -> None:
    """An eager decision. A verdict of speed ("no backend is faster than eager") is `persist=False`: identical
    siblings share it, but a later process measures again (one busy moment must not keep a module eager for good);
    graph breaks and failures that follow from the module's code are stored."""
    if key is None:
        return
    if persist and warnings_are_errors():
        persist = False  # (see `warnings_are_errors`)
    try:
        decision = Decision(key=key, kind="eager", reason=reason, reopen=reopen, source=node.path,
                            module=node.short, graph=graph_label(spec))
    except Exception:
        _logger.debug("decision of %s not kept", node.path, exc_info=True)
        return
    remember(key, decision, persist=persist)


def warnings_are_errors() -> bool:
    """The process turns some warnings into errors (`-W error`, `PYTHONWARNINGS=error`, a program's
    `simplefilter("error")`): a compile then fails on a deprecation warning of torch's own (Inductor's
    `torch.jit.script_method`), which says nothing about the module. Such an eager decision is kept for this
    process only: stored, it kept the module eager in every later process of that cache, with or without the
    option (seventh review, 2026-11-26)."""
    return any(entry[0] == "error" for entry in warnings.filters)


def graph_label(spec: GraphSpec) -> str:
    """`0: x float32[2..8,3,32,32]`: the graph's name and its input tensors, for `cache list`."""
    tensors = []
    for tensor in spec.input_spec.tensors[:3]:
        dims = ",".join(str(lo) if lo == hi else f"{lo}..{hi}" for lo, hi in zip(tensor.min_shape, tensor.max_shape))
        tensors.append(f"{tensor.name} {str(tensor.dtype).replace('torch.', '')}[{dims}]")
    more = ", ..." if len(spec.input_spec.tensors) > 3 else ""
    state = describe_replay_state(spec)
    return f"{spec.name}: {', '.join(tensors)}{more}" + (f" ({state})" if state else "")


def _validated_count(node: TuningNode, spec: GraphSpec) -> int:
    recorder = node.recorder
    try:
        return len(recorder.samples(spec)) if recorder is not None else 0
    except KeyError:
        return 0


def _backend_class(decision: Decision) -> type[Backend]:
    """The class that made the decision: the loaded `Backend` subclass at `backend_path` (nothing is imported
    for it), else the registry's class of that name."""
    from aitune_core.backends.backend import Backend
    from aitune_core.backends.registry import backend_class

    stack = list(Backend.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if f"{cls.__module__}.{cls.__qualname__}" == decision.backend_path:
            return cls
    return backend_class(str(decision.backend_type))


def _check_precision(config: Any) -> None:
    """A decision that runs the module in reduced precision (autocast) is used only where this process asks for
    that precision (`jit_config.precision`, or an autocast candidate among `jit_config.backends`): an fp32
    program whose shared cache entry was edited to autocast bf16 (checksum recomputed) got bf16 answers, validated
    with bf16's wider tolerance (a reviewer's script: 4.8e-3 off, no warning)."""
    if not getattr(config, "autocast_enabled", False):
        return
    import torch

    dtype = getattr(config, "autocast_dtype", None)
    wanted = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(str(jit_config.precision))
    configured = any(getattr(b.config, "autocast_enabled", False) and getattr(b.config, "autocast_dtype", None) == dtype
                     for b in jit_config.backends or ())
    if dtype != wanted and not configured:
        raise RefusedDecision(f"it runs the module under autocast ({dtype}), a precision this process does not ask "
                              f"for (jit_config.precision={jit_config.precision!r})")


class RefusedDecision(ValueError):
    """A stored decision whose backend configuration is refused (not plain data, or not allowed from a file)."""


def rebuild(
    decision: Decision, proxy: torch.nn.Module, spec: GraphSpec, samples: list[Sample], device: torch.device,
    cache_dir: Path,
) -> tuple[Backend, float]:
    """Build the decided backend for this node and validate it on this node's own samples (raises on failure);
    returns it and the seconds its build took (the rest of a warm start is validation: the history says which
    part a slow warm start spent its time in)."""
    from aitune_core.validation.validator import validate_backend

    cls = _backend_class(decision)
    try:
        config = cls.config_class.from_dict(dict(decision.backend_config or {}))
    except (TypeError, ValueError) as exc:  # an entry edited to carry what a file may not (`check_from_file`)
        raise RefusedDecision(str(exc)) from exc
    _check_precision(config)
    backend = cls(config)
    start = time.perf_counter()
    backend.build(proxy, spec, samples, device, cache_dir / backend.key())
    built_s = time.perf_counter() - start
    try:
        validate_backend(backend, spec, samples)
    except BaseException:
        if backend.is_active:
            backend.deactivate()
        raise
    return backend, built_s


def reuse(
    node: TuningNode, proxy: torch.nn.Module, graphs: list[GraphSpec], samples: dict[str, list[Sample]],
    keys: dict[str, str], device: torch.device, cache_dir: Path, first: bool, draft: OutcomeDraft,
    tried: set[str] | None = None,
) -> TuningOutcome | None:
    """Apply the known decisions of `graphs` to the draft: graphs decided here are removed from `graphs`, their
    backends (or failures) join the draft. Returns the outcome when a decision ends the tuning (the node goes
    eager), else None. `tried` (kept by the caller across calls of one job) holds the keys whose decision was
    found: a second call looks only for the others (a refused decision is not refused, and warned about, twice)."""
    from aitune_core.strategies.strategy import TuneReport

    for spec in list(graphs):
        key = keys.get(spec.name)
        found = lookup(key) if key is not None and (tried is None or key not in tried) else None
        if found is None:
            continue
        if tried is not None:
            tried.add(str(key))
        if spec.name in node.retune_due:  # a re-tune over wider ranges, decided here
            draft.retuned.add(spec.name)
        decision, origin = found
        where = f"{decision.source} from {origin}" if origin != "this process" else decision.source
        if decision.kind == "eager":
            reason = f"{_as_own(decision.reason, decision.source, node.path)} (reused the decision of {where})"
            if first and not draft.entries:  # (a node with a reused backend is tuned: its other graphs only fail)
                return draft.eager(reason, reopen=bool(decision.reopen))
            draft.failed[spec.name] = reason
            graphs.remove(spec)
            continue
        start = time.perf_counter()
        try:
            with running_freely(device.type) if origin != "this process" else contextlib.nullcontext():
                backend, built_s = rebuild(decision, proxy, spec, samples[spec.name], device, cache_dir)
        except RefusedDecision as exc:
            registry.log(f"{node.short} graph {spec.name}: refused the decision of {where}: {exc}; tuning it "
                         "normally", logging.WARNING)
            continue
        except Exception as exc:
            registry.log(f"{node.short} graph {spec.name}: the decision of {where} ({decision.describe()}) does "
                         f"not hold here ({type(exc).__name__}: {exc}); tuning it normally")
            continue
        measured = f", measured {decision.speedup:.2f}x there" if decision.speedup is not None else ""
        registry.log(f"{node.short} graph {spec.name}: reused the decision of {where}: {backend.describe()}"
                     f"{measured}; built and validated in {time.perf_counter() - start:.2f}s (build {built_s:.2f}s)")
        draft.entries.append((spec, backend))
        draft.reports.append(TuneReport(backend=backend, strategy="reused decision"))
        graphs.remove(spec)
    return None


def _as_own(reason: str | None, source: str, path: str) -> str:
    """The reason a decision gives, naming the module that reuses it rather than the one that took it: a sibling's
    summary line said "module `PW.l1` is one torch.nn layer" for `PW.l2` (the decision's source follows it)."""
    text = reason or ""
    return text.replace(f"`{source}`", f"`{path}`") if source and source != path else text
