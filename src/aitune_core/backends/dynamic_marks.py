"""`DynamicMarks`: dynamo's dynamic-axis marks put on a call's own tensors for one call, then taken off.

Why: `torch._dynamo.mark_dynamic` / `maybe_mark_dynamic` record the marks as attributes of the tensor object, and
dynamo reads them when it compiles a call. A backend that marks the axes it recorded must not leave them on the
program's tensors (the program's own `torch.compile` would read them later), and must not hand the compiled
function copies of the program's containers either: a forward that fills the dict it is given would fill the copy.
So the marks go on the call's own tensors and come off when the call returns, leaving the attributes as they were
(marks the program made itself included).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

#: the tensor attributes `mark_dynamic` and `maybe_mark_dynamic` set (torch 2.11 to 2.13)
MARK_ATTRIBUTES = (
    "_dynamo_dynamic_indices",
    "_dynamo_dynamic_range",
    "_dynamo_hint_overrides",
    "_dynamo_weak_dynamic_indices",
    "_has_dynamo_dim_marking",
    "_specialize_on",
)
_ABSENT = object()


class DynamicMarks:
    """The mark attributes of the tensors about to be marked, as they were (`keep`), put back by `take_off`."""

    def __init__(self) -> None:
        self._kept: dict[int, tuple[torch.Tensor, dict[str, Any]]] = {}

    def keep(self, tensor: torch.Tensor) -> None:
        """Remember `tensor`'s mark attributes before it is marked (copies: dynamo adds to its sets in place)."""
        if id(tensor) in self._kept:
            return
        state = vars(tensor)
        self._kept[id(tensor)] = (tensor, {name: copy.copy(state[name]) if name in state else _ABSENT
                                           for name in MARK_ATTRIBUTES})

    def take_off(self) -> None:
        """Every kept tensor's mark attributes as they were before `keep`. Never raises."""
        for tensor, before in self._kept.values():
            state = vars(tensor)
            for name, value in before.items():
                if value is _ABSENT:
                    state.pop(name, None)
                else:
                    state[name] = value
        self._kept.clear()
