"""Batch / dynamic / static axis inference across the observations of one graph.

Rules (per tensor axis, over every call recorded for the graph):

- an axis that never changes is static and keeps its int size;
- an axis that changes and is proportional to the batch size at every observation (size / batch the
  same ratio each time; usually the ratio is 1) is a batch axis, named `batchN`;
- any other axis that changes is dynamic, named `dimN` (N is the axis index).

Batch sizes come from the global context (`current_batch_size()`, published by the AOT driver). At
least two different batch sizes are needed to call an axis a batch axis; with one batch size there
are no batch axes (a varying axis is then `dimN`).

When no observation has a known batch size (JIT mode, where nobody publishes one), a heuristic stands
in: if at every observation axis 0 of *every input tensor* has the same size (the inputs "move in
lockstep"), that common size is taken as an implied batch size, and the rules above apply with it. So a
leading axis that varies together across all inputs is `batch0`, and output axes that follow it are
batch axes too. The heuristic is off for the whole graph as soon as one observation has inputs whose
axis 0 disagree, or has no input tensor with at least one axis. It can misname a leading axis that is
really a sequence axis (`[seq, batch, ...]` layouts) when every input shares it; the tuner only uses
the name to decide which axis to scale, and the [min, max] ranges stay exact either way.

Memory does not grow with the number of observations: each axis keeps its min, max and a ratio.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from aitune_core.specs.tensor_spec import Axis

KNOWN = "known"
IMPLIED = "implied"


def implied_batch_size(input_shapes: Sequence[Sequence[int]]) -> int | None:
    """The common axis-0 size of all input tensors, or None when they disagree / there are none."""
    size: int | None = None
    for shape in input_shapes:
        if len(shape) == 0:
            return None
        if size is None:
            size = int(shape[0])
        elif int(shape[0]) != size:
            return None
    return size if size is not None and size > 0 else None


class BatchEvidence:
    """Graph-level record of the batch sizes seen: known (from the context) and implied (lockstep)."""

    __slots__ = ("_implied_first", "_implied_valid", "_implied_varied", "_known_first", "_known_varied")

    def __init__(self) -> None:
        self._known_first: int | None = None
        self._known_varied = False
        self._implied_first: int | None = None
        self._implied_varied = False
        self._implied_valid = True

    def observe(self, batch_size: int | None, implied: int | None) -> None:
        if batch_size is not None:
            if self._known_first is None:
                self._known_first = batch_size
            elif batch_size != self._known_first:
                self._known_varied = True
        if implied is None:
            self._implied_valid = False
        elif self._implied_first is None:
            self._implied_first = implied
        elif implied != self._implied_first:
            self._implied_varied = True

    @property
    def mode(self) -> str | None:
        """Which batch sizes name batch axes: `known`, `implied`, or None (no batch axes)."""
        if self._known_first is not None:
            return KNOWN if self._known_varied else None
        if self._implied_valid and self._implied_varied:
            return IMPLIED
        return None


class ShapeTracker:
    """Per-tensor running statistics: min/max per axis and whether each axis follows the batch size."""

    __slots__ = ("_follows", "_ratios", "max_shape", "min_shape")

    def __init__(self, shape: Sequence[int]) -> None:
        self.min_shape = [int(s) for s in shape]
        self.max_shape = list(self.min_shape)
        # index 0: known batch sizes; index 1: implied batch sizes
        self._ratios: tuple[list[Fraction | None], list[Fraction | None]] = ([None] * len(shape), [None] * len(shape))
        self._follows = ([True] * len(shape), [True] * len(shape))

    @property
    def ndim(self) -> int:
        return len(self.min_shape)

    def observe(self, shape: Sequence[int], batch_size: int | None, implied: int | None) -> bool:
        """Add one observation; returns True when min or max changed."""
        changed = False
        mins, maxs = self.min_shape, self.max_shape
        for i, size in enumerate(shape):
            if size < mins[i]:
                mins[i] = int(size)
                changed = True
            elif size > maxs[i]:
                maxs[i] = int(size)
                changed = True
        for which, batch in ((0, batch_size), (1, implied)):
            if batch is None or batch <= 0:
                continue
            ratios, follows = self._ratios[which], self._follows[which]
            for i, size in enumerate(shape):
                if not follows[i]:
                    continue
                ratio = Fraction(int(size), batch)
                if ratios[i] is None:
                    ratios[i] = ratio
                elif ratios[i] != ratio:
                    follows[i] = False
                    changed = True
        return changed

    def axes(self, mode: str | None) -> tuple[Axis, ...]:
        """Axis names under a batch mode from `BatchEvidence.mode`."""
        follows = None if mode is None else self._follows[0 if mode == KNOWN else 1]
        out: list[Axis] = []
        for i, (lo, hi) in enumerate(zip(self.min_shape, self.max_shape)):
            if lo == hi:
                out.append(lo)
            elif follows is not None and follows[i]:
                out.append(f"batch{i}")
            else:
                out.append(f"dim{i}")
        return tuple(out)


def infer_axes(
    shapes: Sequence[Sequence[int]], batch_sizes: Sequence[int | None] | None = None
) -> tuple[Axis, ...]:
    """Axis names for one tensor observed with `shapes` (one per call) at `batch_sizes`.

    Without batch sizes, the tensor alone stands for "all inputs" in the lockstep heuristic, i.e.
    its own axis 0 is the implied batch size.

    >>> infer_axes([[1, 10, 512], [2, 50, 512]], [1, 2])
    ('batch0', 'dim1', 512)
    """
    if not shapes:
        raise ValueError("infer_axes needs at least one shape")
    batch_sizes = list(batch_sizes) if batch_sizes is not None else [None] * len(shapes)
    if len(batch_sizes) != len(shapes):
        raise ValueError("infer_axes: one batch size (or None) per shape")
    tracker = ShapeTracker(shapes[0])
    evidence = BatchEvidence()
    for shape, batch in zip(shapes, batch_sizes):
        if len(shape) != tracker.ndim:
            raise ValueError(f"rank changed from {tracker.ndim} to {len(shape)}: that is a different graph")
        implied = implied_batch_size([shape])
        evidence.observe(batch, implied)
        tracker.observe(shape, batch, implied)
    return tracker.axes(evidence.mode)
