"""Bounded per-graph sample store that keeps the calls at the shape extremes.

A graph may be called thousands of times while it is recorded; only `capacity` samples are kept
(`config.max_num_samples_stored`). While there is room every call is kept. Once full, a new call is
compared with the stored ones and the least useful of the `capacity + 1` candidates is dropped
(the new call itself when it brings nothing new, and then it is never copied). Usefulness, most
important first:

1. holding the smallest or largest total input size (sum of the input tensors' numel);
2. the number of per-axis extremes held (smallest / largest size of some input tensor axis), so
   the min and max shapes of the graph's spec have a sample to validate them;
3. being the only sample of its batch size;
4. being the only sample of its exact input shapes;
5. age: on a tie the older sample stays, so the store does not churn.

A call offered with `keep=True` (one that missed a tuned graph's compiled code: an input layout the tuning did not
see, `GraphDispatcher`) outranks all of these, up to half the store: a re-tune must see it, and its shapes alone
may bring nothing new.

An extreme shared by several candidates belongs to the oldest of them. When a graph has more
extremes than slots, the samples holding the fewest are dropped; the total-size extremes are always
kept when capacity >= 2. The graph's min/max shapes themselves are tracked from every call by the
recorder, whether or not the call is stored here.

Memory is `capacity` samples, whatever the number of calls; choosing costs O(capacity x axes) per call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aitune_core.recording.sample import Sample

Shapes = tuple[tuple[int, ...], ...]


@dataclass
class _Entry:
    seq: int
    shapes: Shapes
    batch_size: int | None
    total: int
    sample: Sample | None  # None only for the candidate being offered
    kept: bool = False  # offered with `keep=True`


def _total_size(shapes: Shapes) -> int:
    total = 0
    for shape in shapes:
        n = 1
        for s in shape:
            n *= s
        total += n
    return total


class SampleStore:
    """Keeps at most `capacity` samples of one graph, favouring the shape extremes."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._entries: list[_Entry] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._entries)

    def samples(self) -> list[Sample]:
        """Stored samples in recording order."""
        return [e.sample for e in self._entries]  # type: ignore[misc]

    def shapes(self) -> list[Shapes]:
        """Input shapes of the stored samples, in recording order."""
        return [e.shapes for e in self._entries]

    def offer(self, shapes: Sequence[Sequence[int]], batch_size: int | None, make_sample: Callable[[], Sample],
              *, keep: bool = False) -> bool:
        """Consider one call; `make_sample` (which copies tensors) runs only if the call is kept. `keep`: the call
        is stored whatever its shapes, while kept calls hold at most half the store (module docstring)."""
        shapes_t: Shapes = tuple(tuple(int(s) for s in shape) for shape in shapes)
        keep = keep and 2 * sum(e.kept for e in self._entries) < max(self.capacity, 2)
        candidate = _Entry(self._seq, shapes_t, batch_size, _total_size(shapes_t), None, kept=keep)
        self._seq += 1
        if len(self._entries) < self.capacity:
            candidate.sample = make_sample()
            self._entries.append(candidate)
            return True
        victim = self._least_useful([*self._entries, candidate])
        if victim is candidate:
            return False
        candidate.sample = make_sample()
        self._entries.remove(victim)
        self._entries.append(candidate)
        return True

    @staticmethod
    def _least_useful(candidates: list[_Entry]) -> _Entry:
        n = len(candidates)
        total_roles = [0] * n
        axis_roles = [0] * n

        def assign(values: list[int], roles: list[int]) -> None:
            lo, hi = min(values), max(values)
            if lo == hi:
                return
            roles[values.index(lo)] += 1  # index(): the first (oldest) holder of the extreme
            roles[values.index(hi)] += 1

        assign([c.total for c in candidates], total_roles)
        # Input tensors of one graph have fixed ranks, so every candidate has the same axes.
        for t, shape in enumerate(candidates[0].shapes):
            for a in range(len(shape)):
                assign([c.shapes[t][a] for c in candidates], axis_roles)

        batch_counts: dict[int | None, int] = {}
        shape_counts: dict[Shapes, int] = {}
        for c in candidates:
            batch_counts[c.batch_size] = batch_counts.get(c.batch_size, 0) + 1
            shape_counts[c.shapes] = shape_counts.get(c.shapes, 0) + 1

        def usefulness(i: int) -> tuple[bool, int, int, bool, bool, int]:
            c = candidates[i]
            unique_batch = c.batch_size is not None and batch_counts[c.batch_size] == 1
            unique_shapes = shape_counts[c.shapes] == 1
            return (c.kept, total_roles[i], axis_roles[i], unique_batch, unique_shapes, -c.seq)

        return candidates[min(range(n), key=usefulness)]
