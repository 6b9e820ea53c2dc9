"""Fingerprints of Python values, compared before and after one call to tell what the call changed.

Why: tuning replays recorded calls on the program's own module, so a call that keeps state must be recognised
before it is replayed (`module_effects`, `outside_effects`). A fingerprint reads no tensor data: tensors count by
identity and version counter, which every in-place write moves.

- `fingerprint(value)`: one level - simple values by value, tensors by identity and version, small numpy
  arrays, `array.array`s and bytearrays by their bytes, the given sized containers by identity and length,
  random-number generators by their state (`rng_state`), iterators and in-memory streams by what a call moves in
  them (`object_state`), anything else by identity.
- `contents_fingerprint(value, depth)`: also looks `depth` levels into dicts, lists, tuples, deques, plain
  objects (instances with a `__dict__` that are not modules, classes, functions or the standard library's
  machinery), objects of classes with `__slots__`, and the cells of a function's closure. Where state is kept
  one level down, the one-level fingerprint saw nothing: a step count in `self.stats["steps"] += 1`, a cache list
  inside a dict attribute, `self.meter.n += 1` - a forward of that kind, replayed by tuning, read 520 steps after
  10 calls (a reviewer's script on this project's CPU, 2026-11-26); so did a counter in a closure or a `__slots__`
  object (a helper's scripts, 2026-11-27).
  Long containers are read at both ends only (`ITEMS`), an object seen twice is read once (a transformers
  `config` shared by every layer).
- `elements(value)`: a list's items by position, each by `fingerprint` (a global list counter);
  `entries(value)`: a dict's entries, each by `fingerprint` - for globals, where a dict that gains keys is a cache
  and one whose existing entries change is a counter; `attributes(value)`: a plain object's attributes, the same
  way (a global recorder object whose list a forward appends to).
"""

from __future__ import annotations

import array
import collections
import enum
import functools
import itertools
import types
from collections.abc import Iterable
from typing import Any

import torch

from aitune_core.recording.object_state import object_state
from aitune_core.recording.rng_state import rng_state

SIMPLE = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size, enum.Enum)
SIZED = (list, dict, set, bytearray)
#: items of a container read by `contents_fingerprint`: the first and the last half of this many
ITEMS = 64
#: numpy arrays, `array.array`s and bytearrays up to this size are compared by their bytes (`_buffer_contents`)
BUFFER_BYTES = 4096
#: classes from these top-level modules are not walked into (locks, loggers with their level caches, streams)
_MACHINERY = frozenset({"torch", "logging", "threading", "_thread", "concurrent", "asyncio", "multiprocessing",
                        "queue", "io", "_io", "weakref", "socket", "ssl", "subprocess", "selectors", "tqdm"})
_NOT_PLAIN = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
              functools.partial, torch.nn.Module)


def tensor_fingerprint(value: torch.Tensor) -> tuple[Any, ...]:
    try:
        return ("tensor", id(value), value._version)
    except RuntimeError:  # inference tensors track no version counter
        return ("tensor", id(value), None)


def fingerprint(value: Any, sized: tuple[type, ...] = SIZED, *, unreadable: bool = False) -> Any:
    """A value as compared before and after a call: tensors by identity and version, simple values by value (a
    NaN equal to itself), `sized` containers by identity and length, anything else by identity."""
    if isinstance(value, torch.Tensor):
        return tensor_fingerprint(value)
    if isinstance(value, SIMPLE):
        return ("value", type(value), value if value == value else "nan")
    contents = _buffer_contents(value)  # (a numpy counter `self.steps += 1` keeps its identity and length)
    if contents is not None:
        return ("buffer", id(value), contents)
    if isinstance(value, sized):
        return ("sized", id(value), len(value))
    state = rng_state(value)  # (a generator the program keeps: by its state, which every draw moves)
    if state is not None:
        return ("generator", id(value), state)
    state = object_state(value, unreadable)  # (an iterator or an in-memory stream: by what a call moves in it)
    if state is not None:
        return ("state", id(value), state)
    return ("object", id(value))


def _buffer_contents(value: Any) -> Any:
    """The bytes of a small numpy array, `array.array` or `bytearray` (with shape and type), which an in-place edit
    changes without changing identity or length: a step count in `self.steps = np.zeros(1)` read 1009 after 8
    calls under the default strategy (a helper's script, sixth round). Larger ones (over `BUFFER_BYTES`): their
    size only. None for anything else."""
    cls = type(value)
    if cls is bytearray or cls is array.array:
        size = len(value) * (value.itemsize if cls is array.array else 1)
        return (size, bytes(value) if size <= BUFFER_BYTES else None)
    if cls.__name__ == "ndarray" and cls.__module__ == "numpy":
        try:
            small = value.nbytes <= BUFFER_BYTES
            return (value.shape, str(value.dtype), value.tobytes() if small else None)
        except Exception:  # (an object array of something unpicklable, a view of freed memory: identity only)
            return None
    return None


def _ends(items: Iterable[Any], size: int, backwards: Any) -> list[Any]:
    """The first and last `ITEMS // 2` of `items` (all of them when there are at most `ITEMS`)."""
    if size <= ITEMS:
        return list(items)
    half = ITEMS // 2
    return list(itertools.islice(items, half)) + list(itertools.islice(backwards, half))


def _plain(value: Any) -> bool:
    if isinstance(value, _NOT_PLAIN) or not hasattr(value, "__dict__"):
        return False
    return str(type(value).__module__).partition(".")[0] not in _MACHINERY


def _key(key: Any) -> Any:
    return key if isinstance(key, SIMPLE) else ("object", id(key))


def contents_fingerprint(value: Any, depth: int = 2, memo: dict[int, Any] | None = None, *,
                         unreadable: bool = False) -> Any:
    """`fingerprint`, looking `depth` levels into containers and plain objects (module docstring); `memo` (one per
    state taken) reads an object seen twice once, and stops at a container that holds itself."""
    if depth <= 0 or isinstance(value, (torch.Tensor, *SIMPLE)):
        return fingerprint(value, unreadable=unreadable)
    memo = {} if memo is None else memo
    known = memo.get(id(value))
    if known is not None:
        return known
    memo[id(value)] = ("cycle", id(value))
    try:
        result = _contents(value, depth, memo, unreadable)
    except RuntimeError:  # (changed by another thread while read: its size and identity still tell)
        result = fingerprint(value, unreadable=unreadable)
    memo[id(value)] = result
    return result


def _contents(value: Any, depth: int, memo: dict[int, Any], unreadable: bool) -> Any:
    inner = depth - 1

    def down(item: Any) -> Any:
        return contents_fingerprint(item, inner, memo, unreadable=unreadable)

    if isinstance(value, dict):
        items = _ends(value.items(), len(value), reversed(value.items()))
        return ("dict", id(value), len(value),
                tuple((_key(k), down(v)) for k, v in items))
    if isinstance(value, (list, tuple, collections.deque)):
        items = _ends(iter(value), len(value), reversed(value))
        return ("sequence", id(value), len(value), tuple(down(v) for v in items))
    if _plain(value) and rng_state(value) is None:  # (a `random.Random` has a `__dict__` too: by its state)
        state = vars(value)
        items = _ends(state.items(), len(state), reversed(state.items()))
        return ("plain", id(value), tuple((k, down(v)) for k, v in items))
    if isinstance(value, types.FunctionType) and value.__closure__:  # (a counter kept in a closure's cell)
        return ("closure", id(value), tuple(_cell(cell, down) for cell in value.__closure__))
    names = _slot_names(type(value))
    if names:  # (an object of a class with `__slots__` keeps its state there, without a `__dict__`)
        return ("slots", id(value), tuple((n, down(getattr(value, n, _UNSET))) for n in names))
    return fingerprint(value, unreadable=unreadable)


_UNSET = ("unset",)


def _cell(cell: Any, down: Any) -> Any:
    try:
        return down(cell.cell_contents)
    except ValueError:  # (an empty cell)
        return ("empty",)


@functools.lru_cache(maxsize=256)
def _slot_names(cls: type) -> tuple[str, ...]:
    """The `__slots__` names of a class outside torch's and the standard library's machinery (empty otherwise)."""
    if str(cls.__module__).partition(".")[0] in _MACHINERY or cls.__module__ == "builtins":
        return ()
    names: list[str] = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and name not in names:
                names.append(name)
    return tuple(names[:ITEMS])


def attributes(value: Any, sized: tuple[type, ...] = SIZED) -> dict[str, Any]:
    """A plain object's attributes (read at both ends when many), each by `fingerprint`; empty for anything that is
    not a plain object (`_plain`)."""
    if not _plain(value) or rng_state(value) is not None:
        return {}
    state = vars(value)
    try:
        items = _ends(state.items(), len(state), reversed(state.items()))
    except RuntimeError:  # (changed by another thread while read)
        return {}
    return {str(k): fingerprint(v, sized) for k, v in items}


def elements(value: list[Any], sized: tuple[type, ...] = SIZED) -> dict[int, Any]:
    """A list's items by position (read at both ends when long: negative positions from the end), each by
    `fingerprint`: an element changed in place (`COUNT[0] += 1`) leaves the list's identity and length as they
    were."""
    size = len(value)
    try:
        if size <= ITEMS:
            return {i: fingerprint(v, sized) for i, v in enumerate(list(value))}
        half = ITEMS // 2
        head = {i: fingerprint(value[i], sized) for i in range(half)}
        head.update({-i: fingerprint(value[-i], sized) for i in range(1, half + 1)})
        return head
    except (RuntimeError, IndexError):  # (changed by another thread while read)
        return {}


def entries(value: dict[Any, Any], sized: tuple[type, ...] = SIZED) -> dict[Any, Any]:
    """A dict's entries (read at both ends when long), each by `fingerprint`, keyed like `contents_fingerprint`."""
    try:
        items = _ends(value.items(), len(value), reversed(value.items()))
    except RuntimeError:  # (changed by another thread while read)
        return {}
    return {_key(k): fingerprint(v, sized) for k, v in items}
