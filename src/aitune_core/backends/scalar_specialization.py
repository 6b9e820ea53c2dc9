"""`ScalarSpecialization`: finds, in a dynamo backend's warm-up, a forward whose trace specializes on the value of a
free scalar (`specs/free_scalars.py`).

Why: dynamo compiles the first value of an int argument as a constant and, when a second value comes, compiles
again with the int symbolic (automatic dynamic), after which every value runs that second graph: two compiles,
then none. A forward that uses the value where a trace needs a constant (an index into a Python list, a
`range(n)` loop) is compiled again for every new value instead; served in dynamo's run-only mode
(`run_only.py`), each such value would miss the compiled code and run eagerly. The warm-up runs the recorded
samples, so a third distinct value that still adds a compiled entry shows it: the build fails with the reason,
and the graph stays eager rather than compiling once per value.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from aitune_core.errors import BackendBuildError
from aitune_core.specs.free_scalars import free_values
from aitune_core.specs.graph_spec import GraphSpec
from aitune_core.specs.tree import flatten_values

#: distinct values compiled before a further value must reuse the compiled code (the constant, then the symbol)
VALUES_COMPILED = 2


def _entries(code: Any) -> int | None:
    listing = getattr(torch._dynamo.eval_frame, "_debug_get_cache_entry_list", None)
    if listing is None or code is None:
        return None
    try:
        return len(listing(code))
    except Exception:  # (an internal of torch: a torch without it never fails a build)
        return None


class ScalarSpecialization:
    """Per build: the free-scalar values a warm-up ran, and whether a new one compiled again."""

    def __init__(self, graph_spec: GraphSpec, entry: Callable[..., Any] | None) -> None:
        self._spec = graph_spec
        self._code = getattr(entry, "__code__", None) if graph_spec.free_scalars() else None
        self._seen: set[tuple[Any, ...]] = set()

    @contextlib.contextmanager
    def call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[None]:
        """Around one warm-up call: raises `BackendBuildError` when the call brought the third (or later) distinct
        value of the free scalars and dynamo compiled a new entry for it."""
        before = _entries(self._code)
        if before is None:
            yield
            return
        leaves, _ = flatten_values(self._spec.bind(args, kwargs))
        values = free_values(self._spec.input_spec, leaves)
        new = values not in self._seen
        yield
        self._seen.add(values)
        after = _entries(self._code)
        if new and len(self._seen) > VALUES_COMPILED and after is not None and after > before:
            raise BackendBuildError(
                f"graph {self._spec.name}: the forward's trace specializes on the value of "
                f"{', '.join(self._spec.free_scalars())} (value {len(self._seen)} compiled again); every value "
                "would be a compile of its own")
