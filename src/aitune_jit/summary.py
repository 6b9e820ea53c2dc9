"""The one WARNING-level summary logged at normal interpreter exit: what was tuned, with which backend, and
the speed-up measured at recorded shapes where the strategy measured one.

For unmodified scripts, two environment variables add the debugging views at exit (printed to stderr):
`AITUNE_JIT_PRINT_HIERARCHY=1` (the hierarchy) and `AITUNE_JIT_PRINT_HISTORY=1` (the history).
"""

from __future__ import annotations

import atexit
import dataclasses
import itertools
import logging
import os
import sys
import threading
import weakref
from typing import TYPE_CHECKING

from aitune_core.log import has_real_handler
from aitune_jit.node_registry import registry
from aitune_jit.state import NodeState
from aitune_jit.worker import unfinished_at_exit

if TYPE_CHECKING:
    from aitune_jit.node_registry import TreeNode

_logger = logging.getLogger("aitune.jit")


@dataclasses.dataclass
class TunedRecord:
    path: str
    short: str
    level: int
    backends: list[str]
    speedup: float | None


_lock = threading.Lock()
#: distinct tuned-module lines in the exit summary at most
MAX_TUNED_LINES = 20
#: keyed by a serial number per node (not the path: two models of one class have the same path; not id():
#: the address of a node whose module died is reused by later nodes)
_records: dict[int, TunedRecord] = {}
_keys: weakref.WeakKeyDictionary[TreeNode, int] = weakref.WeakKeyDictionary()
_serial = itertools.count()

#: longest reason of an eager module in the exit summary (`short_reason`)
REASON_CHARS = 300


def _key(node: TreeNode) -> int:
    key = _keys.get(node)
    if key is None:
        key = _keys[node] = next(_serial)
    return key


_registered = False


def record_tuned(node: TreeNode, backends: list[str], speedup: float | None) -> None:
    """Remember a tuned node with its backends' descriptions (by value: the summary must not keep the model
    alive)."""
    with _lock:
        _records[_key(node)] = TunedRecord(node.path, node.short, node.level, backends, speedup)
    register_atexit()  # (a forked child that tunes for itself reports at its exit: `_after_fork_in_child`)


def forget(node: TreeNode) -> None:
    """A tuned node that went eager (its backends failed at run time) is no longer reported as tuned."""
    with _lock:
        key = _keys.get(node)
        if key is not None:
            _records.pop(key, None)


def summary_lines() -> list[str]:
    with _lock:
        records = list(_records.values())
    nodes = list(registry.walk())
    lines = [f"aitune JIT tuning summary: {len(records)} module(s) tuned, {registry.nodes_seen} module(s) seen"]
    tuned: dict[str, int] = {}  # one line per distinct text: a program that builds many models gets counts
    for record in records:
        speed = (
            f", {record.speedup:.2f}x faster than eager at recorded shapes"
            if record.speedup is not None
            else " (speed not measured)"
        )
        text = f"  🎯 {record.path} ({record.short}, level {record.level}): {', '.join(record.backends)}{speed}"
        tuned[text] = tuned.get(text, 0) + 1
    shown = list(tuned.items())
    lines.extend(text if count == 1 else f"{text} (x{count})" for text, count in shown[:MAX_TUNED_LINES])
    if len(shown) > MAX_TUNED_LINES:
        more_tuned = len(shown) - MAX_TUNED_LINES
        lines.append(f"  ... and {more_tuned} more tuned module(s); see PatchedModule.print_history()")
    unfinished = unfinished_at_exit()
    tuned_paths = {node.path for node in nodes if node.state is NodeState.TUNED}
    untuned = [path for path in unfinished if path not in tuned_paths]
    packaging = {node.path for node in nodes if getattr(node, "packaging_only", False)}
    more = [path for path in unfinished if path in tuned_paths and path not in packaging]  # another graph's job
    making = [path for path in unfinished if path in packaging]  # tuned; only a package for later runs was left
    if untuned:
        lines.append(f"  ⏳ still tuning at exit (ran eagerly): {', '.join(untuned[:10])}")
    if more:
        lines.append(f"  ⏳ still tuning more shapes at exit (only those calls ran eagerly): {', '.join(more[:10])}")
    if making:
        lines.append(f"  📦 still making a warm-start package at exit (a later run rebuilds instead): "
                     f"{', '.join(making[:10])}")
    waiting = [node.path for node in nodes if getattr(node, "waiting_on_others", False)]
    if waiting:
        lines.append(f"  ⏸ waiting at exit for another process's tuning with the same cache folder (ran eagerly): "
                     f"{', '.join(waiting[:10])}")
    for node in nodes:
        if node.state is NodeState.TUNED and node.fallbacks:
            lines.append(f"  ↪ {node.path}: {node.fallbacks} call(s) outside the tuned shape ranges ran eagerly")
        if node.state is NodeState.TUNED and node.missed_code:
            lines.append(f"  ↪ {node.path}: {node.missed_code} call(s) missed the compiled code (an attribute, a "
                         "global, a config value or the grad mode changed since it was traced) and ran the original "
                         "forward")
    eager = [node for node in nodes if node.state is NodeState.EAGER]
    for node in eager[:10]:
        lines.append(f"  ⚠️ {node.path} stayed eager: {short_reason(node.reason)}")
    if len(eager) > 10:
        lines.append(f"  ... and {len(eager) - 10} more eager module(s); see PatchedModule.print_history()")
    return lines


def short_reason(reason: str | None) -> str:
    """`reason` on one line, cut at `REASON_CHARS`: dynamo's explanation of a graph break runs to 1.4 KB and came
    once per break (four such lines, 6 KB of the program's stderr, for transformers' continuous batching in a
    helper's script, sixth round); the node's history keeps the whole text."""
    text = " ".join(str(reason or "").split())
    if len(text) <= REASON_CHARS:
        return text
    return text[:REASON_CHARS].rstrip() + " ... (the whole text: PatchedModule.print_history())"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def log_summary() -> None:
    """Log the summary once, at WARNING, if the hook saw any module.

    The `aitune` logger carries a NullHandler (library convention), which would also swallow what Python
    prints by default for WARNING records when the program configured no logging; in that case the summary
    goes to stderr the way `logging.lastResort` would print it.
    """
    if registry.nodes_seen == 0 and not _records:
        return
    try:
        if _env_flag("AITUNE_JIT_PRINT_HIERARCHY"):
            sys.stderr.write("\n".join(registry.hierarchy_lines()) + "\n")
        if _env_flag("AITUNE_JIT_PRINT_HISTORY"):
            sys.stderr.write("\n".join(["JIT Tuning History:", *registry.history]) + "\n")
        message = "\n".join(summary_lines())
        if _logger.isEnabledFor(logging.WARNING) and not has_real_handler(_logger):
            sys.stderr.write(message + "\n")
        else:
            _logger.warning(message)
    except Exception:  # never fail at interpreter exit
        pass


def register_atexit() -> None:
    global _registered
    with _lock:
        if not _registered:
            _registered = True
            atexit.register(log_summary)


def _after_fork_in_child() -> None:
    """A forked child (a prefork server's worker, a DataLoader worker) printed the parent's summary again at its
    exit, one copy per child: it reports only what it tunes itself."""
    global _registered, _lock
    _lock = threading.Lock()  # (another thread may have held it at the fork)
    if _registered:
        atexit.unregister(log_summary)
        _registered = False
    _records.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def reset() -> None:
    with _lock:
        _records.clear()
