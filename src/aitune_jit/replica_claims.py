"""Replicas sharing a cache folder tune each graph once: the first claims it, the others wait for its decision.

Why: the store (`decisions.py`) lets a process reuse what an earlier one finished, but replicas of a server start
together: each found no decision and tuned every module itself (N compiles of the same graphs, on a shared GPU or
CPU, while requests were served). Now a job that is about to tune a graph with no stored decision takes its claim
(`aitune_core.tuning_claim`, a file next to where the decision will be). Where another live process holds the
claim, the graph is left out of this job (`OutcomeDraft.waiting`): its calls run the original module, the node
looks again every `POLL_S` seconds (on its next recorded call after that), and reuses the decision once it is
stored, validated on this process's own samples as any stored decision. A claim whose holder is gone or past
its lifetime (the holder's tuning timeout and a margin) is taken over, and when the holder ends without storing a
decision (a verdict of speed is kept in its process only), the next look finds no claim and tunes here.

The calls recorded while a node waits may widen the graph's ranges (a batch of 32 after two of 1), which changes
its key: the look takes the graph as it was when the wait began, with the samples inside it, whenever that
graph's decision is stored (`back_to_waited`); the wider calls are then misses, tuned again later over the wider
ranges as any graph's are (`range_growth.py`).

`jit_config.blocking` never waits (the call that tunes would wait on another process): it takes a free claim, so
that background replicas wait for it, and tunes a claimed graph anyway. `jit_config.wait_for_replicas = False`,
or `reuse_decisions = False`, turns claims off.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import TYPE_CHECKING, Any

from aitune_core import tuning_claim
from aitune_jit import decisions
from aitune_jit.config import jit_config

if TYPE_CHECKING:
    import torch

    from aitune_core.recording.sample import Sample
    from aitune_core.specs.graph_spec import GraphSpec
    from aitune_jit.outcome import OutcomeDraft, TuningNode

_logger = logging.getLogger("aitune.jit")

#: seconds between two looks for the decision of a graph another process is tuning
POLL_S = 2.0
#: a claim's lifetime when jobs have no time limit (`jit_config.tuning_timeout_s` None), seconds
UNLIMITED_JOB_LIFETIME_S = 3600.0
#: added to the job's time limit: the holder's job is cut at its limit, and it may still be publishing
LIFETIME_MARGIN_S = 60.0


#: id of a node whose job is running -> the keys that job claimed (`release_for` a job the worker abandoned)
_held: dict[int, list[str]] = {}
_held_lock = threading.Lock()


def lifetime_s() -> float:
    timeout = jit_config.tuning_timeout_s
    limit = (UNLIMITED_JOB_LIFETIME_S if timeout is None else timeout) + LIFETIME_MARGIN_S
    return min(limit, tuning_claim.LONGEST_LIFETIME_S)


def claim_or_wait(node: TuningNode, graphs: list[GraphSpec], keys: dict[str, str], draft: OutcomeDraft) -> list[str]:
    """Claim each graph of `graphs` (about to be tuned: no decision was found) for this process. Graphs another
    live process claimed are removed from `graphs` and noted in `draft.waiting` (not in blocking mode). Returns the
    keys this process holds now: `release` them when the job ends. Never raises: a claim that cannot be read or
    written leaves its graph to be tuned here, as without claims."""
    if not (jit_config.wait_for_replicas and jit_config.reuse_decisions and keys):
        return []
    folder = decisions.store().folder
    held: list[str] = []
    with _held_lock:
        _held[id(node)] = held
    for spec in list(graphs):
        key = keys.get(spec.name)
        if key is None:
            continue
        try:
            holder = tuning_claim.take(folder, key, lifetime_s())
        except Exception:  # (`take` absorbs file-system errors; anything else must not stop the job either)
            _logger.debug("claiming %s failed", key, exc_info=True)
            continue
        if holder is None:
            held.append(key)
        elif not jit_config.blocking:
            draft.waiting[spec.name] = (holder.describe(), spec)
            graphs.remove(spec)
    return held


def release(node: TuningNode, keys: list[str]) -> None:
    """Give up this process's claims of `keys`, taken by `node`'s job (its decisions are stored by now, or it has
    none to give)."""
    with _held_lock:
        if _held.get(id(node)) is keys:
            del _held[id(node)]
    if not keys:
        return
    folder = decisions.store().folder
    for key in keys:
        with contextlib.suppress(OSError):
            tuning_claim.release(folder, key)


def release_for(node: TuningNode) -> None:
    """The worker abandoned `node`'s job (it outran `jit_config.tuning_timeout_s`): whatever that job still builds
    is never stored, so its claims go now instead of keeping other replicas waiting until they expire."""
    with _held_lock:
        keys = _held.pop(id(node), None)
    if keys:
        release(node, list(keys))


def back_to_waited(node: TuningNode, graphs: list[GraphSpec], samples: dict[str, list[Sample]], keys: dict[str, str],
                   strategy: Any, device: torch.device) -> None:
    """For each graph this node waited for whose ranges grew meanwhile: while the graph as it was (the one the other
    process tunes) is still claimed by that process, or once its decision is stored, put that graph, its key and
    the samples inside it in place of the wider one, so that the job waits again or reuses the decision instead of
    tuning the wider graph here (whose key no other process claimed). Only when the holder let go without a
    decision is the wider graph tuned here."""
    waited = node.waited_specs
    if not waited or not keys:
        return
    folder = decisions.store().folder
    for index, spec in enumerate(graphs):
        old = waited.get(spec.name)
        if old is None or spec.name not in keys:
            continue
        old_key = decisions.keys_for(node, [old], strategy, device).get(old.name)
        if old_key is None or old_key == keys[spec.name]:
            continue
        if not decisions.store().path(old_key).is_file() and tuning_claim.holder(folder, old_key) is None:
            continue
        inside = [sample for sample in samples[spec.name] if old.accepts(*sample.inputs_to(None))]
        if inside:
            graphs[index], samples[spec.name], keys[spec.name] = old, inside, old_key
