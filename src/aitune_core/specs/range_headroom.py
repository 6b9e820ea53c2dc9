"""`with_headroom(spec)`: a graph's varying axes widened to the powers of two around their recorded range.

Why: a JIT graph's ranges come from the few calls recorded before it was tuned (two, by default). A server whose
requests vary in length (a BERT classifier with sequence lengths 32..128) then sends most calls outside the tuned
range to the original module until the graph is tuned again - each time a compile. The backends that serve a
range (a dynamic Inductor graph, a TensorRT profile) run the same kernels for every size inside it, so a call
between two recorded sizes is trusted exactly as much as a size a little beyond them: recorded [35, 57] is
served as [32, 64], recorded [33, 120] as [32, 128]. Only axes that varied are widened (a batch of 8 seen every
time stays 8), a size of 1 is never added below a range that does not hold it (dynamo specializes 1), and the
recorded samples stay what the backend is validated on. `jit_config.range_headroom = False` serves the recorded
range only.
"""

from __future__ import annotations

from dataclasses import replace

from aitune_core.specs.graph_spec import GraphSpec
from aitune_core.specs.sample_metadata import SampleMetadata
from aitune_core.specs.tensor_spec import TensorSpec


def _floor_pow2(value: int) -> int:
    return 1 << (value.bit_length() - 1) if value > 0 else value


def _ceil_pow2(value: int) -> int:
    return 1 << (value - 1).bit_length() if value > 1 else value


def widened_bounds(low: int, high: int) -> tuple[int, int]:
    """The power-of-two bounds around [low, high]; unchanged when the axis did not vary."""
    if high <= low:
        return low, high
    new_low = low if low <= 1 else max(2, _floor_pow2(low))
    return new_low, max(high, _ceil_pow2(high))


def _widened_tensor(spec: TensorSpec) -> TensorSpec:
    if spec.is_static():
        return spec
    low, high = list(spec.min_shape), list(spec.max_shape)
    for axis in spec.non_static_axes():
        low[axis], high[axis] = widened_bounds(low[axis], high[axis])
    return replace(spec, min_shape=tuple(low), max_shape=tuple(high))


def _widened_metadata(metadata: SampleMetadata) -> SampleMetadata:
    return metadata.with_tensors([_widened_tensor(t) for t in metadata.tensors])


def with_headroom(spec: GraphSpec) -> GraphSpec:
    """`spec` with every varying input and output axis widened by `widened_bounds` (the same spec when none
    varied). Name, structure, binder and strictness are kept, so dispatch and decision keys stay stable."""
    inputs, outputs = _widened_metadata(spec.input_spec), _widened_metadata(spec.output_spec)
    if inputs == spec.input_spec and outputs == spec.output_spec:
        return spec
    return replace(spec, input_spec=inputs, output_spec=outputs)
