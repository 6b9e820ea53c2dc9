"""`ArgumentWatch`: what one call did to its arguments, seen from just before and just after the forward ran.

Why it exists: tuning replays recorded calls (the graph-break probe, a compile's warm-up, validation, timing).
A forward that changes its arguments - appends to a caller-owned KV cache, adds keys to its input dict, writes
into an input tensor - cannot be replayed on the caller's objects, and a backend that does not repeat the change
exactly (an exported graph, a CUDA-graph replay writing its own buffers into the caller's object) would change
what the program computes. So every recorded call is watched:

- `ArgumentWatch.before(args, kwargs)` rebuilds the argument containers (so what is recorded is what the forward
  received, not what it left behind: a forward that adds keys to its input dict must not change the recorded
  structure) and takes a fingerprint of every tensor and object reachable from the arguments: a tensor by
  identity, version counter and shape (no data is read), containers by their items, plain objects by their
  attributes, to a bounded depth and size.
- `changes()`, after the call, names the first argument whose fingerprint differs, or returns None.

A fingerprint holds references to the tensors it saw, so an identity cannot be reused while the watch lives.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from aitune_core.specs.tree import tree_map

#: how deep into nested objects the fingerprint looks, and how many values it visits at most per call
MAX_DEPTH = 6
MAX_NODES = 4096

_SIMPLE = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size, enum.Enum)
_OPAQUE = "opaque"


def _tensor_state(tensor: torch.Tensor) -> tuple[Any, ...]:
    try:
        version: Any = tensor._version
    except RuntimeError:  # inference tensors track no version counter
        version = None
    return ("tensor", id(tensor), version, tuple(tensor.shape))


class _Fingerprint:
    """A bounded walk of one value: a nested tuple that compares equal when nothing observable changed."""

    def __init__(self) -> None:
        self.keep: list[Any] = []  # what the fingerprint refers to by identity stays alive with it
        self.budget = MAX_NODES

    def of(self, value: Any, depth: int = 0) -> Any:
        self.budget -= 1
        if self.budget < 0:
            return (_OPAQUE, "budget")
        if isinstance(value, torch.Tensor):
            self.keep.append(value)
            return _tensor_state(value)
        if isinstance(value, _SIMPLE):
            return ("value", type(value).__name__, repr(value))
        self.keep.append(value)
        if isinstance(value, (torch.nn.Module, type)) or (callable(value) and not hasattr(value, "__dict__")):
            return (_OPAQUE, id(value))
        if depth >= MAX_DEPTH:
            return (_OPAQUE, id(value))
        if isinstance(value, (list, tuple)):
            return ("seq", id(value), len(value), tuple(self.of(item, depth + 1) for item in value))
        if isinstance(value, Mapping):
            try:
                items = list(value.items())
            except Exception:
                return (_OPAQUE, id(value))
            return ("map", id(value), tuple((repr(k), self.of(v, depth + 1)) for k, v in items))
        if isinstance(value, (set, frozenset)):
            return ("set", id(value), len(value))
        attributes = getattr(value, "__dict__", None)
        if not isinstance(attributes, dict):
            return (_OPAQUE, id(value))
        return ("object", id(value), tuple((name, self.of(v, depth + 1)) for name, v in list(attributes.items())))


def _describe(name: str, value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"its input tensor `{name}` (in place)"
    return f"its argument `{name}` ({type(value).__name__})"


class ArgumentWatch:
    """Taken right before a forward runs; `changes()` right after it tells whether the forward changed its arguments.

    `args` / `kwargs` are the arguments as the forward received them: containers rebuilt, leaves shared.
    """

    __slots__ = ("_before", "_fingerprint", "_names", "_values", "args", "kwargs")

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any], positional_names: Sequence[str] = ()) -> None:
        self.args, self.kwargs = _rebuilt(args, kwargs)
        names = list(positional_names)[: len(args)]
        self._names = names + [f"args[{i}]" for i in range(len(names), len(args))] + list(kwargs)
        self._values = [*args, *kwargs.values()]
        self._fingerprint = _Fingerprint()
        self._before = [self._fingerprint.of(value) for value in self._values]

    @classmethod
    def before(
        cls, args: tuple[Any, ...], kwargs: dict[str, Any], positional_names: Sequence[str] = ()
    ) -> ArgumentWatch:
        """Watch one call; `positional_names` (the forward's parameter names) name positional arguments in messages."""
        return cls(tuple(args), dict(kwargs), positional_names)

    def changes(self) -> str | None:
        """A description of the first argument the call changed (`its argument `past_key_values` (DynamicCache)`),
        or None when every argument is as it was."""
        after = _Fingerprint()
        for name, value, before in zip(self._names, self._values, self._before):
            if after.of(value) != before:
                return _describe(name, value)
        return None


def _rebuilt(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """New containers around the same leaves, so later changes to the caller's containers do not show here."""
    try:
        new_args, new_kwargs = tree_map(lambda t: t, (args, kwargs))
        return tuple(new_args), dict(new_kwargs)
    except Exception:  # a container class that cannot be rebuilt: the fingerprint still sees changes to it
        return args, kwargs
