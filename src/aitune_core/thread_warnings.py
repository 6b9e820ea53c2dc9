"""`private_warnings()`: while aitune compiles on a thread, what torch's compile path does to Python's warning
state stays on that thread.

Why: torch's compile path enters `warnings.catch_warnings()` (AOTAutograd's functional call, the recording of
CUDA graph trees with `record=True`, dynamo's side effects) and adds filters inside it. `catch_warnings` saves and
restores process-wide state: `warnings.filters`, `showwarning` and the record hook. On a tuning job's thread
beside the program (reviewer scripts on this project's CPU, 2026-11-26):

- filters the program's thread added meanwhile were undone when the job's catch ended: a script that added an
  "error" filter per request lost 34 of 2994, so warnings it meant to raise were printed instead;
- with `record=True`, the program's own warnings went into torch's list, and the program's own
  `catch_warnings(record=True)` block got the job's warnings or lost its own;
- every enter and exit told Python the filters had changed, which empties every module's once-per-place record:
  a deprecation warning the program saw once was shown again after each compile (15 times in one background run,
  twice in blocking mode, where tuning runs on the program's thread).

How: while installed (`install`), `warnings.catch_warnings`, `filterwarnings`, `simplefilter` and
`resetwarnings` act per thread for a thread inside `private_warnings()`: its catches save and restore nothing
process-wide, filters it adds inside such a catch go to a list of its own, and `warnings._showwarnmsg` - which
Python calls for every warning that passed the process's filters - applies that thread's own filters ("ignore"
drops, "error" raises; a module pattern is not checked, `warnings._showwarnmsg` does not know the module) and
records into its own `record=True` lists; any other warning of such a thread goes to the sink it was given (the
capture's collection), never to a `record=True` block the program has open. A warning dropped, recorded or sunk
there was not shown, so it is taken out of
Python's once-per-place records (`forget_shown`). Outside any catch, such a thread's filters (a module's
import-time `filterwarnings`, imported on the job thread) stay process-wide, as without aitune. Other threads are
untouched.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from aitune_core.patch import Patch

_OriginalCatch = warnings.catch_warnings
_state = threading.local()  # .depth: private_warnings() nesting; .frames: the private catches entered, innermost last
_patches: list[Patch] = []
_install_lock = threading.Lock()


@dataclass
class _Frame:
    """One private `catch_warnings`: the thread's filters inside it, and its record list (`record=True`)."""

    filters: list[tuple[str, Any, type, int]] = field(default_factory=list)
    log: list[Any] | None = None


@contextlib.contextmanager
def private_warnings(sink: Callable[[Any], None] | None = None) -> Iterator[None]:
    """The calling thread's `catch_warnings` and the filters it adds inside them stay its own (module docstring).
    With `sink`, every warning the thread would show (a `warnings.WarningMessage`) goes there instead: never to a
    `catch_warnings(record=True)` block the program has open on another thread."""
    install()
    _state.depth = getattr(_state, "depth", 0) + 1
    sinks = _state.__dict__.setdefault("sinks", [])
    sinks.append(sink)
    try:
        yield
    finally:
        sinks.pop()
        _state.depth -= 1


def to_debug_log(message: Any) -> None:
    """A sink for `private_warnings`: the warning logged at DEBUG (logger `aitune.warnings`) - a side job's imports
    warn (torch's deprecations), and none of that may reach the program's `catch_warnings(record=True)` blocks."""
    logging.getLogger("aitune.warnings").debug("%s: %s", message.category.__name__, message.message)


def _private() -> bool:
    return getattr(_state, "depth", 0) > 0


def _frames() -> list[_Frame]:
    frames = getattr(_state, "frames", None)
    if frames is None:
        frames = _state.frames = []
    return frames


def _innermost() -> _Frame | None:
    frames = getattr(_state, "frames", None)
    return frames[-1] if _private() and frames else None


class _Catch(_OriginalCatch):  # type: ignore[misc, valid-type]
    """`warnings.catch_warnings` while installed: private on a thread inside `private_warnings()`."""

    def __enter__(self) -> Any:
        if not _private():
            self._aitune_frame = None
            return super().__enter__()
        outer = _innermost()
        frame = _Frame(list(outer.filters) if outer is not None else [], [] if self._record else None)
        _frames().append(frame)
        self._aitune_frame = frame
        action = getattr(self, "_filter", None)  # (Python 3.11+: `catch_warnings(action=...)`)
        if action is not None:
            _simplefilter(*action)
        return frame.log

    def __exit__(self, *exc_info: Any) -> None:
        frame = getattr(self, "_aitune_frame", None)
        if frame is None:
            return super().__exit__(*exc_info)
        frames = _frames()
        if frame in frames:
            del frames[frames.index(frame):]
        return None


def _add(frame: _Frame, action: str, text: Any, category: type, lineno: int, append: bool) -> None:
    item = (action, text, category, lineno)
    if item in frame.filters:
        frame.filters.remove(item)
    if append:
        frame.filters.append(item)
    else:
        frame.filters.insert(0, item)


def _filterwarnings(action: str, message: str = "", category: type = Warning, module: str = "", lineno: int = 0,
                    append: bool = False) -> None:
    frame = _innermost()
    if frame is None:
        return _patched_original("filterwarnings")(action, message, category, module, lineno, append)
    _add(frame, action, re.compile(message, re.I) if message else None, category, lineno, append)
    return None


def _simplefilter(action: str, category: type = Warning, lineno: int = 0, append: bool = False) -> None:
    frame = _innermost()
    if frame is None:
        return _patched_original("simplefilter")(action, category, lineno, append)
    _add(frame, action, None, category, lineno, append)
    return None


def _resetwarnings() -> None:
    frame = _innermost()
    if frame is None:
        return _patched_original("resetwarnings")()
    frame.filters.clear()
    return None


def _action(frame: _Frame, message: Any) -> str | None:
    text = str(message.message)
    for action, pattern, category, lineno in frame.filters:
        if ((pattern is None or pattern.match(text)) and issubclass(message.category, category)
                and (lineno == 0 or message.lineno == lineno)):
            return action
    return None


def _showwarnmsg(message: Any) -> None:
    frame = _innermost()
    if frame is not None:
        action = _action(frame, message)
        if action == "error":
            raise message.message
        log = next((f.log for f in reversed(_frames()) if f.log is not None), None)
        if action == "ignore" or log is not None:
            if log is not None and action != "ignore":
                log.append(message)
            forget_shown(message.message, message.category, message.filename, message.lineno)
            return
    sinks = getattr(_state, "sinks", None)
    sink = sinks[-1] if _private() and sinks else None
    if sink is not None:
        sink(message)
        forget_shown(message.message, message.category, message.filename, message.lineno)
        return
    _patched_original("_showwarnmsg")(message)


def _patched_original(name: str) -> Any:
    """The `warnings` function a stand-in replaced (the module's own when not installed)."""
    return _originals.get(name) or getattr(warnings, name)


_originals: dict[str, Any] = {}


def install() -> None:
    """Put the per-thread stand-ins in `warnings` (once; `uninstall` takes them off)."""
    with _install_lock:
        if _patches:
            return
        for name, replacement in (("catch_warnings", _Catch), ("filterwarnings", _filterwarnings),
                                  ("simplefilter", _simplefilter), ("resetwarnings", _resetwarnings),
                                  ("_showwarnmsg", _showwarnmsg)):
            patch = Patch(warnings, name, replacement)
            _originals[name] = patch.found()
            _patches.append(patch.apply())


def uninstall() -> None:
    """`warnings` as before `install` (where nobody replaced the stand-ins since: `Patch.restore`)."""
    with _install_lock:
        while _patches:
            _patches.pop().restore()


def installed() -> bool:
    return bool(_patches)


def forget_shown(message: Any, category: type, filename: str, lineno: int) -> None:
    """Take a warning that was not shown out of Python's once-per-place records: the program's own call that warns
    at the same place must still show it.

    Why: a replay of a recorded call on the job thread warned first (a deprecated argument of transformers'
    `forward`), Python noted the place as done in the warning module's `__warningregistry__`, and the program's
    own warning there never appeared (sixth review, 2026-11-26)."""
    text = str(message)
    keys = ((text, category, lineno), (text, category, 0))
    try:
        for module in list(sys.modules.values()):
            if getattr(module, "__file__", None) == filename:
                registry = getattr(module, "__warningregistry__", None)
                if isinstance(registry, dict):
                    for key in keys:
                        registry.pop(key, None)
        warnings.onceregistry.pop((text, category), None)
    except Exception:  # (a module whose attributes cannot be read: the record stays)
        pass
