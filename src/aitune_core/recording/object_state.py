"""The state of an object that a call can change behind an unchanged identity: an iterator, an in-memory stream.

Why: `value_fingerprint` compares what it cannot look into by identity, and some objects change without a new
identity or a `__dict__`: a forward that takes `next(self.counter)` from an `itertools.count`, a generator or a
list iterator it keeps, or that writes a line into an `io.StringIO` it keeps, did it again in every call tuning
replayed (a helper's scripts on this CPU, 2026-11-27: a counter read 19 after 10 calls, a log buffer held 26
writes after 20). With their state in the fingerprint, such a module is not replayed (`module_effects`).

`object_state(value)` returns a value that compares equal exactly when the state is the same, read without moving
it, or None for anything else (compared by identity, as before):

- `io.StringIO` / `io.BytesIO`: the position and, for bytes, the length (in memory: reading them flushes nothing;
  file and terminal streams are left out, their `tell()` flushes the program's output);
- an `itertools.count`: its `repr`, which shows the next value;
- the standard library's sequence iterators (list, tuple, range, str, bytes, dict views): what is left
  (`__length_hint__`);
- a generator: whether it finished, where it stopped, and its local values (simple ones by value, containers by
  identity and length - and a list's first simple items -, tensors by identity and version);
- a `queue.Queue`: how many items it holds;
- any other iterator of the standard library's (`itertools.cycle`, `islice`, `map`, `zip`, ...), whose state
  cannot be read without moving it, when asked (`unreadable`, for a module's attributes): a new token at every
  read, so it always reads as changed - a module that keeps one is not replayed, moved or not (a helper's
  scripts: `cycle` and `islice` attributes gave other answers after tuning).
"""

from __future__ import annotations

import io
import itertools
import queue
import types
from typing import Any

import torch

#: iterator types whose `__length_hint__` is what is left and reading it moves nothing
_SEQUENCE_ITERATORS = tuple({type(iter(x)) for x in ([], (), range(1), "", b"", {}, {}.values(), {}.items(), set())}
                            | {type(reversed([])), type(reversed(range(1)))})
_SIMPLE_LOCALS = (type(None), bool, int, float, complex, str, bytes)
_SIZED_LOCALS = (list, dict, set, bytearray)
_HEAD = 8
#: modules whose iterator types are read as always changed when not readable above
_ITERATOR_MODULES = frozenset({"itertools", "builtins"})


def object_state(value: Any, unreadable: bool = False) -> Any:
    """The state of `value` as the module docstring says, or None where it has none that can be read; with
    `unreadable`, an iterator whose state cannot be read gets a new token at every read (a module's attribute; a
    global `zip` beside a model in a script, untouched by its forward, would stop it from ever being tuned)."""
    try:
        if isinstance(value, io.BytesIO) and not value.closed:
            return ("bytes-stream", value.tell(), value.getbuffer().nbytes)
        if isinstance(value, io.StringIO) and not value.closed:
            return ("text-stream", value.tell())
        if isinstance(value, itertools.count):
            return ("count", repr(value))
        if isinstance(value, _SEQUENCE_ITERATORS):
            return ("iterator", value.__length_hint__())
        if isinstance(value, types.GeneratorType):
            return _generator_state(value)
        if isinstance(value, queue.Queue):
            return ("queue", value.qsize())
        if unreadable and _unreadable_iterator(value):
            return ("iterator", object())  # (compares unequal to every other read)
    except (ValueError, TypeError, AttributeError, BufferError):
        return None
    return None


def _unreadable_iterator(value: Any) -> bool:
    cls = type(value)
    return cls.__module__ in _ITERATOR_MODULES and hasattr(cls, "__next__") and hasattr(cls, "__iter__")


def _generator_state(generator: types.GeneratorType) -> tuple[Any, ...]:
    frame = generator.gi_frame
    if frame is None:
        return ("generator", "finished")
    local_values = tuple(sorted((k, _local(v)) for k, v in frame.f_locals.items()))
    return ("generator", frame.f_lasti, local_values)


def _local(value: Any) -> Any:
    if isinstance(value, _SIMPLE_LOCALS):
        return ("value", value) if value == value else ("nan",)
    if isinstance(value, torch.Tensor):
        return ("tensor", id(value), getattr(value, "_version", None))
    if isinstance(value, _SIZED_LOCALS):  # (and the first items of a list: a counter kept as `k[0] += 1`)
        head = tuple(v for v in value[:_HEAD] if isinstance(v, _SIMPLE_LOCALS)) if isinstance(value, list) else ()
        return ("sized", id(value), len(value), head)
    return ("object", id(value))
