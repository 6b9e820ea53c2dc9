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
- a generator: whether it finished, where it stopped, and its simple local values.
"""

from __future__ import annotations

import io
import itertools
import types
from typing import Any

#: iterator types whose `__length_hint__` is what is left and reading it moves nothing
_SEQUENCE_ITERATORS = tuple({type(iter(x)) for x in ([], (), range(1), "", b"", {}, {}.values(), {}.items())})
_SIMPLE_LOCALS = (type(None), bool, int, float, complex, str, bytes)


def object_state(value: Any) -> Any:
    """The state of `value` as the module docstring says, or None where it has none that can be read."""
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
    except (ValueError, TypeError, AttributeError, BufferError):
        return None
    return None


def _generator_state(generator: types.GeneratorType) -> tuple[Any, ...]:
    frame = generator.gi_frame
    if frame is None:
        return ("generator", "finished")
    local_values = tuple(sorted((k, v) for k, v in frame.f_locals.items() if isinstance(v, _SIMPLE_LOCALS)
                                and v == v))
    return ("generator", frame.f_lasti, local_values)
