"""`OutsideEffects`: what one call of a module did outside the module and its arguments - to the globals its
forwards read, to its classes' attributes, and to what the program prints or logs.

Why it exists: tuning replays recorded calls (the eager timings, a compile's warm-up, validation), and
`ModuleEffects` and `ArgumentWatch` only see the module and the call's arguments. A script whose forward printed
the batch size, counted its calls in a global and appended to a global list, called 30 times under the JIT in
blocking mode (this CPU, 2026-11-26), printed 476 lines instead of 30 and read 476 calls and 476 list items:
each replay did it again. Such a forward is not replayed, so its module is not tuned (its children still can be;
dynamo would break the graph at `print` anyway).

What is fingerprinted before the call and compared after it:

- the globals of every Python module that defines the `forward` of a module in the tree, by name: simple values by
  value (a counter), tensors by identity and version counter (a running statistic kept outside the module), lists
  and deques by identity and length (a log of calls), anything else by identity (a rebinding). Dictionaries count by
  identity and by the entries they had before the call, each the same way (`COUNTS["calls"] += 1`, a list kept under
  a key); an entry added is no change: a forward that fills a cache keyed by shape (a mask per length) is common,
  and replaying it fills nothing new. Sets count by identity only. The globals of the program's own modules that
  such a file imports count the same way (a forward calling `helpers.record(x)`: 26 records after 20 calls in a
  helper's script; modules under the interpreter's library and site-packages are left out). A plain object's
  attributes count the same way
  (a global recorder whose list a forward appends to: 26 entries after 20 calls in a helper's script, and in the
  background its compiled calls rewrote the list, which held 52 of 300). Dunder names (`__warningregistry__`,
  which `warnings.warn` fills) are left out;
- the attributes of the module classes themselves (`type(self).calls += 1`), the same way; the items of a global
  list (`STEPS[0] += 1`); the mutable defaults and the closure cells of a class's `forward` and of the program's
  own functions among those globals and class attributes (a list default a forward or a helper appends to);
- text written to `sys.stdout` or `sys.stderr` by the calling thread, and log records made on it (outside
  aitune's own loggers), while the call ran: `_OutputRoute` stands in for both streams and for the log record
  factory while any watch runs, passes everything on unchanged, and counts only the watching threads' writes;
- what the calling thread did to files, processes and the network, from Python's audit events (`open` for
  writing, removing or renaming files, starting a process, connecting or sending on a socket: `_WRITE_EVENTS`).
  Writes while torch compiles on that thread (the program's own `torch.compile` of a submodule, compiling in
  the call) are Inductor's caches and do not count.
  A helper's script on this project's CPU whose forward appended a line to a file had 16 lines after 2 calls:
  each replay wrote again before the graph break sent the module to eager. The hook (`sys.addaudithook`, which
  cannot be taken off) is added at the first watch and returns at once while no watch runs. `torch.save`, whose
  C++ writer opens a path without an audit event, is noted by a stand-in while any watch runs (a script that
  saved an activation per call left 14 files too many). Writes that raise no audit event otherwise are not
  seen: a direct `os.write` to a file descriptor, a `save` imported from torch before the watch began.

A watch must end: `changes()` ends it, and `abandon()` does when the forward raised.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import site
import sys
import sysconfig
import threading
import types
from typing import Any

import torch

from aitune_core.patch import Patch
from aitune_core.recording.module_effects import first_difference
from aitune_core.recording.value_fingerprint import (
    SIMPLE,
    attributes,
    elements,
    entries,
    fingerprint,
)

_LOGS = (list, bytearray, collections.deque)

_OURS = frozenset({"aitune", "aitune_core", "aitune_jit", "aitune_aot"})  # (aitune's own state: not the program's)


def _namespaces(module: torch.nn.Module) -> dict[str, Any]:
    """Where a replay of `module` could write: label -> a namespace (a module's globals, a class's attributes)."""
    spaces: dict[str, Any] = {}
    for sub in module.modules():
        for klass in type(sub).__mro__:
            if klass.__module__.startswith("torch.") or klass is object:
                continue
            spaces.setdefault(f"class {klass.__qualname__}", klass.__dict__)
            for function in _unwrapped(klass.__dict__.get("forward")):
                namespace = function.__globals__
                spaces.setdefault(f"module {namespace.get('__name__', '?')}", namespace)
        for helper in _helper_objects_files(sub):
            spaces.setdefault(f"module {helper.get('__name__', '?')}", helper)
    for label, namespace in list(spaces.items()):
        if label.startswith("module "):
            for helper in _program_helpers(namespace):
                spaces.setdefault(f"module {helper.get('__name__', '?')}", helper)
    return spaces


def _helper_objects_files(sub: torch.nn.Module) -> list[dict[str, Any]]:
    """The globals of the program's own files that define the classes of objects a module keeps (a diffusers
    attention processor of the program's, which appends to a store in its own file: 120 stored maps against 96 in
    a helper's script, the UNet's forward being the library's)."""
    found = []
    for value in list(vars(sub).values()):
        if isinstance(value, (torch.nn.Module, torch.Tensor, type)) or not hasattr(value, "__dict__"):
            continue
        file_module = sys.modules.get(type(value).__module__)
        namespace = getattr(file_module, "__dict__", None)
        package = type(value).__module__.partition(".")[0]
        if namespace is not None and package not in _OURS and _programs_own(namespace.get("__file__")):
            found.append(namespace)
    return found


def _program_helpers(namespace: dict[str, Any]) -> list[dict[str, Any]]:
    """The globals of the program's own modules that a forward's file imports (a module, or a function taken from
    one): a forward that calls `helpers.record(x)` changes `helpers`' globals. The program's own: a module whose
    file is outside the interpreter's library and site-packages (torch, transformers and the standard library
    are left out: their globals are not the program's state, and reading them every recorded call would cost)."""
    found: dict[int, dict[str, Any]] = {}
    for value in list(namespace.values()):
        if isinstance(value, types.ModuleType):
            helper = vars(value)
        elif isinstance(value, types.FunctionType):
            helper = value.__globals__
        else:
            continue
        package = str(helper.get("__name__", "")).partition(".")[0]
        if (helper is not namespace and id(helper) not in found and package not in _OURS
                and _programs_own(helper.get("__file__"))):
            found[id(helper)] = helper
    return list(found.values())


@functools.lru_cache(maxsize=1024)
def _programs_own(path: str | None) -> bool:
    if not path:
        return False
    resolved = os.path.realpath(path)
    return not any(resolved.startswith(root) for root in _library_roots())


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    roots = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    roots.add(site.getusersitepackages() if hasattr(site, "getusersitepackages") else "")
    return tuple(os.path.realpath(root) + os.sep for root in roots if root)


def _mutable_defaults(function: Any) -> dict[str, Any]:
    """The default values of `function`'s parameters that a call can change in place, by parameter name: a list
    or dict default kept across calls (`def forward(self, x, *, _seen=[])`, a step count in a helper's script:
    15 after 6 calls under the JIT, and wrong answers from the third). Simple values cannot change."""
    code = getattr(function, "__code__", None)
    positional = getattr(function, "__defaults__", None) or ()
    found: dict[str, Any] = {}
    if code is not None and positional:
        names = code.co_varnames[:code.co_argcount][-len(positional):]
        found.update(zip(names, positional))
    found.update(getattr(function, "__kwdefaults__", None) or {})
    return {name: value for name, value in found.items() if not isinstance(value, SIMPLE)}


def _unwrapped(forward: Any) -> list[Any]:
    """`forward` and the functions its decorators wrap (`__wrapped__`, as `functools.wraps` leaves it): each
    has the globals of the file that defines it."""
    functions = []
    while hasattr(forward, "__globals__") and len(functions) < 8 and forward not in functions:
        functions.append(forward)
        forward = getattr(forward, "__wrapped__", None)
    return functions


def _state(spaces: dict[str, Any]) -> dict[tuple[str, Any], Any]:
    state: dict[tuple[str, Any], Any] = {}
    for label, namespace in spaces.items():
        for name, value in list(namespace.items()):
            if isinstance(name, str) and not (name.startswith("__") and name.endswith("__")):
                for inner, entry in _entries_of(value):
                    state[(label, (name, *inner) if inner else name)] = entry
                if type(value) is types.FunctionType:  # (a helper keeping a count in a default or a closure)
                    for part, kept in _function_parts(name, value):
                        for inner, entry in _entries_of(kept):
                            state[(label, (name, part, *inner))] = entry
    return state


def _entries_of(value: Any) -> list[tuple[tuple[Any, ...], Any]]:
    """`value`'s fingerprint (under `()`) and, one level in, a dict's entries, a list's items (`STEPS[0] += 1`
    keeps the list's length) or a plain object's attributes (a global recorder whose list a forward appends to,
    as attention-map stores do), each under its key."""
    found: list[tuple[tuple[Any, ...], Any]] = [((), fingerprint(value, _LOGS))]
    if type(value) is dict:
        inner = entries(value, _LOGS)
    elif type(value) is list:
        inner = elements(value, _LOGS)
    else:
        inner = attributes(value, _LOGS)
    found.extend(((key,), entry) for key, entry in inner.items())
    return found


def _function_parts(name: str, function: types.FunctionType) -> list[tuple[str, Any]]:
    """What a function keeps between calls: its mutable defaults and its closure's cells, as ("default <name>" /
    "closure <name>", value), and those of the functions its decorators wrap (`__wrapped__`: " of <qualname>"). A
    forward's, wherever it is defined (`def forward(self, x, *, _seen=[])`: 15 after 6 calls under the JIT, and
    wrong answers); any other function's only in the program's own files (`def next_id(_n=[0])` called from a
    forward: 17 after 8 calls; helpers' scripts, sixth round): a library's decorators keep their wrapped functions
    in closures, not the program's state."""
    if name != "forward" and not _programs_own(function.__code__.co_filename):
        return []
    parts: list[tuple[str, Any]] = []
    for depth, layer in enumerate(_unwrapped(function)):
        cells = getattr(layer, "__closure__", None)
        defaults = _mutable_defaults(layer)
        if not (cells or defaults):
            continue
        where = f" of {layer.__qualname__}" if depth else ""
        parts.extend((f"default {key}{where}", value) for key, value in defaults.items())
        for key, cell in zip(layer.__code__.co_freevars, cells or ()):
            try:
                parts.append((f"closure {key}{where}", cell.cell_contents))
            except ValueError:  # (an empty cell)
                continue
    return parts


class _CountingStream:
    """`sys.stdout` or `sys.stderr` while watches run: every write goes on to the stream it stands in for."""

    def __init__(self, target: Any, route: _OutputRoute) -> None:
        self._target = target
        self._route = route

    def write(self, text: str) -> int:
        self._route.note()
        return self._target.write(text)

    def writelines(self, lines: Any) -> None:
        self._route.note()
        self._target.writelines(lines)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


#: audit events by which a call changes something outside the process's memory (besides `open` for writing)
_WRITE_EVENTS = frozenset({
    "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.truncate", "os.link", "os.symlink", "shutil.rmtree",
    "shutil.move", "shutil.copyfile", "os.system", "subprocess.Popen", "os.posix_spawn", "os.spawn", "os.exec",
    "os.fork", "os.kill", "socket.connect", "socket.sendto", "socket.sendmsg",
})
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def _writes(event: str, args: tuple[Any, ...]) -> bool:
    """Whether an audit event changes something outside the process (see `_WRITE_EVENTS`)."""
    if event == "open":
        mode = args[1] if len(args) > 1 else None
        if isinstance(mode, str):
            return any(letter in mode for letter in "wax+")
        flags = args[2] if len(args) > 2 else 0
        return isinstance(flags, int) and bool(flags & _WRITE_FLAGS)
    return event in _WRITE_EVENTS


def _torch_compiles_here() -> bool:
    """Whether torch compiles on the calling thread now (dynamo's compile context is set): the program's own
    `torch.compile` of a submodule, compiling inside a recorded call, writes Inductor's cache files and starts its
    compile workers - nothing a replay would do again (the code is compiled then), and taken for the forward's
    writes they left the module eager (a helper's script, sixth round)."""
    guards = sys.modules.get("torch._guards")
    context = getattr(guards, "CompileContext", None)
    return context is not None and context.try_get() is not None


class _OutputRoute:
    """Counts what watching threads print and log, and notes what they write outside the process (see the module
    docstring); installed while any watch runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: dict[int, int] = {}  # thread -> watches running on it
        self._events: collections.Counter[int] = collections.Counter()  # thread -> writes and records so far
        self._wrote: collections.Counter[int] = collections.Counter()  # thread -> audit events that wrote outside
        self._last: dict[int, str] = {}  # thread -> the last such event's name
        self._audited = False  # (the audit hook, added once: Python cannot remove one)
        self._streams: dict[str, _CountingStream] = {}
        self._factory: functools.partial | None = None  # the stand-in record factory, while installed
        self._save: Patch | None = None  # `torch.save` noted, while installed

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if not self._active:
            return
        try:
            ident = threading.get_ident()
            if ident in self._active and _writes(event, args) and not _torch_compiles_here():
                self._wrote[ident] += 1
                self._last[ident] = event
        except Exception:  # (an audit hook must never raise into the code that raised the event)
            pass

    def wrote(self) -> tuple[int, str | None]:
        """How many audit events wrote outside the process on the calling thread during its watches, and the last
        one's name."""
        ident = threading.get_ident()
        return self._wrote[ident], self._last.get(ident)

    def note(self) -> None:
        ident = threading.get_ident()
        if ident in self._active:
            self._events[ident] += 1

    def start(self) -> int:
        ident = threading.get_ident()
        with self._lock:
            if not self._active:
                self._install()
            self._active[ident] = self._active.get(ident, 0) + 1
            return self._events[ident]

    def stop(self) -> int:
        ident = threading.get_ident()
        with self._lock:
            count = self._events[ident]
            left = self._active.get(ident, 0) - 1
            if left > 0:
                self._active[ident] = left
            else:
                self._active.pop(ident, None)
                self._events.pop(ident, None)
                self._wrote.pop(ident, None)
                self._last.pop(ident, None)
            if not self._active:
                self._uninstall()
            return count

    def _install(self) -> None:
        if not self._audited:
            sys.addaudithook(self._audit)
            self._audited = True
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if stream is not None:
                self._streams[name] = _CountingStream(stream, self)
                setattr(sys, name, self._streams[name])
        self._factory = functools.partial(self._record, logging.getLogRecordFactory())
        logging.setLogRecordFactory(self._factory)
        self._save = Patch(torch, "save", functools.partial(self._saving, torch.save)).apply()

    def _saving(self, save: Any, *args: Any, **kwargs: Any) -> Any:
        """`torch.save` as the program called it, noted for a watching thread: its C++ writer opens a path without
        an audit event."""
        ident = threading.get_ident()
        if ident in self._active:
            self._wrote[ident] += 1
            self._last[ident] = "torch.save"
        return save(*args, **kwargs)

    def _uninstall(self) -> None:
        if self._save is not None:
            self._save.restore()  # (a `torch.save` the program set since is kept: `Patch.restore`)
            self._save = None
        for name, proxy in self._streams.items():
            if getattr(sys, name) is proxy:  # (a stream the program set since is the program's: kept)
                setattr(sys, name, proxy._target)
        self._streams = {}
        if self._factory is not None and logging.getLogRecordFactory() is self._factory:
            logging.setLogRecordFactory(self._factory.args[0])
        self._factory = None

    def _record(self, factory: Any, *args: Any, **kwargs: Any) -> logging.LogRecord:
        """The record `factory` (the one this route stood in for) makes; noted unless aitune logs it, or torch
        while it compiles on this thread (the program's own `torch.compile` inside the call: its graph-break and
        recompile records are not the forward's output)."""
        record = factory(*args, **kwargs)
        name = str(record.name)
        if not name.startswith("aitune") and not (name.startswith("torch") and _torch_compiles_here()):
            self.note()
        return record


_ROUTE = _OutputRoute()


class OutsideEffects:
    """The fingerprint of what a call of `module` could change outside it, taken before the call."""

    __slots__ = ("_events", "_spaces", "_state", "_wrote")

    def __init__(self, spaces: dict[str, Any]) -> None:
        self._spaces = spaces
        self._state = _state(spaces)
        self._events: int | None = _ROUTE.start()
        self._wrote = _ROUTE.wrote()[0]

    @classmethod
    def before(cls, module: torch.nn.Module) -> OutsideEffects:
        return cls(_namespaces(module))

    def abandon(self) -> None:
        """End the watch without looking (the call raised)."""
        if self._events is not None:
            _ROUTE.stop()
            self._events = None

    def changes(self) -> str | None:
        """What the call did outside the module, in words ("prints or logs", "changes the global `calls` of module
        __main__"), or None. Ends the watch."""
        if self._events is None:
            return None
        events, self._events = self._events, None
        wrote, last = _ROUTE.wrote()
        if _ROUTE.stop() != events:
            return "prints or logs"
        if wrote != self._wrote:
            return f"writes outside the process (audit event `{last}`: a file, a process or the network)"
        difference = first_difference(self._state, _state(self._spaces), added=_added_global)
        if difference is None:
            return None
        (label, name), removed = difference
        if isinstance(name, tuple) and isinstance(name[1], str) and name[1].startswith(("default ", "closure ")):
            return f"changes the {name[1]} of the function `{name[0]}` of {label}"
        what = f"{name[0]}[{name[1]!r}]" if isinstance(name, tuple) else name
        return f"{'removes' if removed else 'changes'} `{what}` of {label}"


def _added_global(key: tuple[str, Any]) -> bool:
    """Whether a global that is new after the call counts as a change: a new name does, a new entry of a global
    dict does not (a cache filled by shape; the module docstring), nor a new name that begins with two underscores:
    dynamo installs its own in the globals of the code it compiles (`__builtins_dict___8`, `__compiled_fn_3`, ...;
    the program's own `torch.compile` compiling inside a call, in a helper's script, sixth round)."""
    return not isinstance(key[1], tuple) and not str(key[1]).startswith("__")
