"""What a graph's replays must run under besides their inputs: the thread-local state the program called it in.

Tuning replays a graph's recorded calls - to compile and warm up a backend, to validate it, to time it, to check
for graph breaks, to precompile it - often on the background worker's thread, which has none of the program's
thread-local torch state. `replaying(spec)` sets what `GraphSpec` records of it: the autocast state
(`autocast_state`) and the default device (`default_device`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from aitune_core.specs.autocast_state import NO_AUTOCAST, autocast_as, describe_autocast
from aitune_core.specs.default_device import default_device_as

if TYPE_CHECKING:
    from aitune_core.specs.graph_spec import GraphSpec


@contextlib.contextmanager
def replaying(spec: GraphSpec | None) -> Iterator[None]:
    """The body runs under the thread state `spec`'s calls were made under (nothing changes for None)."""
    if spec is None:
        yield
        return
    with autocast_as(getattr(spec, "autocast", NO_AUTOCAST)), default_device_as(getattr(spec, "default_device", None)):
        yield


def describe_replay_state(spec: GraphSpec) -> str:
    """`""` for a graph called with neither autocast nor a default device, else e.g. `"autocast cuda bfloat16,
    default device cuda:0"` (for labels and tables)."""
    parts = [describe_autocast(spec.autocast)] if spec.autocast else []
    if spec.default_device:
        parts.append(f"default device {spec.default_device}")
    return ", ".join(parts)
