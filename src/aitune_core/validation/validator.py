"""Correctness check of a built backend against the outputs the ORIGINAL module produced when recording.

`validate_backend(backend, graph_spec, data, tolerance_fn, criterion)` runs every sample through the backend, then
the first sample once more, each time on private copies of the sample's inputs (`private_inputs.py`: validation
never changes the recorded samples), and checks:

1. structure: the output has the same layout (containers, keys, field names, leaf kinds) as the recorded output;
2. Python ints / floats are finite, tensors are finite - except where the recorded reference has the same
   non-finite value at the same place (NaN where the reference is NaN, the same infinity);
3. tensors have the recorded dtype and a shape consistent with the output spec: the rank, every static axis, and
   every batch / dynamic axis equal to the reference's size for that sample (within the spec's [min, max] when a
   sample has no reference);
4. values agree with `sample.output`: floating tensors by the rule of `criterion.py` (whole-tensor L2 error within
   the element-wise allowance `atol + rtol * |ref|`, at most a small fraction of elements outside that allowance,
   none off by more than a cap scaled to the tensor's largest value), on float64 copies (complex: complex128),
   with `(rtol, atol) = tolerance_fn(dtype)`; integers and bools exactly; other constants by value for simple
   types (None, str, bool, ...) and by their own `==` otherwise (e.g. a cache object in a model output);
5. inputs: the backend left the tensors in its inputs (and in argument objects) unchanged, unless the original
   module changes them too (`Sample.mutates_inputs`); for such a stateful sample, the state the backend left in
   its copy of the arguments matches `Sample.inputs_after`: the same tensors at the same places (values by the
   rule of 4), the same layout of flags, Nones and lengths (`object_signature`), and an output that is one of
   the argument objects (a KV cache returned with the logits) is the backend's own copy of that object;
6. output aliasing (`kept_outputs.py`): the tensors returned for the first sample (and written into its argument
   objects) still hold their values after every later call, the first sample's repeat included. A backend that
   reuses its output buffers (a CUDA-graph replay) fails with "output buffer reused / overwritten by a later call".

The first failure raises `ValidationError` naming the backend, the sample, the output path, and for value
mismatches a `ValidationError` from `criterion.mismatch_error` whose message and `closeness` attribute give the
number of elements outside the
element-wise tolerance and how many were allowed, the max absolute error with its index and values and its cap,
and the relative L2 error with its limit. Large tensors are compared in chunks, so validation does not need
float64 copies of whole outputs at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from aitune_core.errors import ValidationError
from aitune_core.log import get_logger
from aitune_core.specs.autocast_state import autocast_dtypes
from aitune_core.specs.object_signature import object_signature
from aitune_core.specs.replay_state import replaying
from aitune_core.specs.tree import TENSOR, flatten
from aitune_core.validation.criterion import Criterion, FloatComparison, mismatch_error
from aitune_core.validation.kept_outputs import KeptOutputs
from aitune_core.validation.private_inputs import PrivateInputs, argument_state, has_floating_tensors
from aitune_core.validation.tensor_slots import holds_tensors, reachable
from aitune_core.validation.tolerance import Tolerance, under_autocast

if TYPE_CHECKING:
    from aitune_core.backends.backend import Backend
    from aitune_core.recording.sample import Sample
    from aitune_core.specs.graph_spec import GraphSpec
    from aitune_core.specs.sample_metadata import SampleMetadata
    from aitune_core.specs.tensor_spec import TensorSpec

_logger = get_logger("validation")

ToleranceFn = Callable[[torch.dtype], Tolerance]

_CHUNK = 1 << 22  # elements per float64 comparison chunk
_SIMPLE = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)


def validate_backend(
    backend: Backend,
    graph_spec: GraphSpec,
    data: Sequence[Sample],
    tolerance_fn: ToleranceFn | None = None,
    criterion: Criterion | None = None,
) -> None:
    """Run every sample through `backend` and check its outputs and inputs (see the module docstring).

    `tolerance_fn(dtype)` defaults to `backend.tolerance` (widened to the autocast dtype's for a graph called under
    `torch.autocast`: `under_autocast`), `criterion` to `Criterion.from_config()`. Raises
    `ValidationError` on the first problem (for values not close enough, with a `closeness` attribute).
    """
    tolerance_fn = under_autocast(tolerance_fn or backend.tolerance, autocast_dtypes(graph_spec.autocast))
    criterion = criterion or Criterion.from_config()
    if not data:
        raise ValidationError(f"{backend.describe()}: no samples to validate graph {graph_spec.name} with")
    kept: KeptOutputs | None = None
    with torch.no_grad(), replaying(graph_spec):
        for index, sample in enumerate(data):
            where = f"{backend.describe()} (graph {graph_spec.name}, sample {index})"
            output, inputs = _run_sample(backend, sample, where)
            written = inputs.check(where)
            if kept is None:
                kept = KeptOutputs(output, written, label="sample 0")
            else:
                kept.check(f"sample {index}", where)
            _check_call(output, inputs, sample, graph_spec, tolerance_fn, criterion, where)
        assert kept is not None
        _run_repeat(backend, graph_spec, data[0], kept, tolerance_fn, criterion)


def _call(backend: Backend, inputs: PrivateInputs, where: str) -> Any:
    try:
        return backend.infer(*inputs.args, **inputs.kwargs)
    except ValidationError:
        raise
    except Exception as exc:
        raise ValidationError(f"{where} failed: {type(exc).__name__}: {exc}") from exc


def _run_sample(backend: Backend, sample: Sample, where: str) -> tuple[Any, PrivateInputs]:
    """One backend call on private copies of the sample's inputs; returns the output and those inputs as the call
    left them. Raises `ValidationError` when the call fails."""
    inputs = PrivateInputs(sample, backend.device)
    return _call(backend, inputs, where), inputs


def _check_call(
    output: Any,
    inputs: PrivateInputs,
    sample: Sample,
    graph_spec: GraphSpec,
    tolerance_fn: ToleranceFn,
    criterion: Criterion,
    where: str,
) -> None:
    """The output against the recorded one and, for a stateful sample, the state left in the arguments."""
    validate_output(output, sample.output, graph_spec.output_spec, tolerance_fn, context=where, criterion=criterion,
                    returned=inputs.returned_objects(sample))
    if sample.inputs_after is not None:
        check_state_after(inputs, sample.inputs_after, tolerance_fn, criterion, where)


def check_state_after(
    inputs: PrivateInputs,
    expected: tuple[Any, Any],
    tolerance_fn: ToleranceFn,
    criterion: Criterion,
    where: str,
) -> None:
    """What a backend left in its copy of a stateful call's arguments against what the original module left
    (`expected`, the sample's `inputs_after`); raises `ValidationError` at the first difference."""
    want, got = argument_state(expected), inputs.state()
    if set(want.tensors) != set(got.tensors):
        missing, extra = sorted(set(want.tensors) - set(got.tensors)), sorted(set(got.tensors) - set(want.tensors))
        shown = ", ".join([f"no tensor at {p}" for p in missing[:2]] + [f"a tensor at {p}" for p in extra[:2]])
        raise ValidationError(f"{where}: the backend left its arguments in another state than the original module "
                              f"did ({shown})")
    for path, tensor in want.tensors.items():
        _check_tensor(got.tensors[path], tensor, None, tolerance_fn, criterion, f"{where}: {path} after the call")
    for path, value in want.constants.items():
        if path not in got.constants:
            raise ValidationError(f"{where}: the backend left no value at {path} (the original module: {value!r})")
        _check_constant(got.constants[path], value, True, tolerance_fn, f"{where}: {path} after the call", {})
    if object_signature((inputs.args, inputs.kwargs)) != object_signature(tuple(expected)):
        raise ValidationError(f"{where}: the backend left its argument objects with another layout (attributes, "
                              "list lengths) than the original module did")


def _run_repeat(
    backend: Backend,
    graph_spec: GraphSpec,
    sample: Sample,
    kept: KeptOutputs,
    tolerance_fn: ToleranceFn,
    criterion: Criterion,
) -> None:
    """Sample 0 once more, its floating inputs shuffled when it has any, then the aliasing check.

    A backend that keeps one output buffer per input shape overwrites sample 0's outputs here even when no other
    sample has sample 0's shapes. Shuffled inputs are not a recorded call, so that output is not compared with
    anything, and a failure of the call only means the inputs did not suit the model: the aliasing check still runs.
    """
    perturb = has_floating_tensors(sample)
    label = "sample 0 with shuffled inputs" if perturb else "sample 0 run again"
    where = f"{backend.describe()} (graph {graph_spec.name}, {label})"
    inputs = PrivateInputs(sample, backend.device, perturb=perturb)
    try:
        output = _call(backend, inputs, where)
    except ValidationError as exc:
        if not perturb:
            raise
        _logger.debug("%s: %s", where, exc)
        kept.check(label, where)
        return
    inputs.check(where)
    kept.check(label, where)
    if not perturb:
        _check_call(output, inputs, sample, graph_spec, tolerance_fn, criterion, where)


def validate_output(
    output: Any,
    reference: Any,
    output_spec: SampleMetadata | None,
    tolerance_fn: ToleranceFn,
    *,
    context: str = "backend",
    criterion: Criterion | None = None,
    returned: dict[int, Any] | None = None,
) -> None:
    """Check one output against the recorded `reference` (None: only finiteness, structure and the spec's shapes).

    `criterion` (default `Criterion.from_config()`) decides when a floating tensor is close enough. `returned`
    (`PrivateInputs.returned_objects`): reference objects that are argument objects of the call, each mapped to
    the object the backend's output must hold in its place.
    """
    criterion = criterion or Criterion.from_config()
    out_leaves, out_tree = flatten(output)
    if reference is not None:
        ref_leaves, ref_tree = flatten(reference)
        if out_tree != ref_tree:
            raise ValidationError(
                f"{context}: output structure differs from the original module's: got {out_tree!r}, "
                f"expected {ref_tree!r}"
            )
        references: list[Any] = [leaf for _, leaf in ref_leaves]
    else:
        references = [None] * len(out_leaves)
        if output_spec is not None and out_tree != output_spec.structure:
            raise ValidationError(
                f"{context}: output structure differs from the recorded spec: got {out_tree!r}, "
                f"expected {output_spec.structure!r}"
            )
    specs: list[TensorSpec | None]
    if output_spec is not None and len(output_spec.tensors) == sum(
        1 for kind in out_tree.leaf_kinds() if kind == TENSOR
    ):
        spec_iter = iter(output_spec.tensors)
        specs = [next(spec_iter) if isinstance(leaf, torch.Tensor) else None for _, leaf in out_leaves]
    else:
        if output_spec is not None and reference is None:
            raise ValidationError(
                f"{context}: output has {sum(1 for k in out_tree.leaf_kinds() if k == TENSOR)} tensors, "
                f"the recorded spec {len(output_spec.tensors)}"
            )
        specs = [None] * len(out_leaves)

    for (locator, value), ref, spec in zip(out_leaves, references, specs):
        path = f"output{locator}" if locator else "output"
        if isinstance(value, torch.Tensor):
            _check_tensor(value, ref, spec, tolerance_fn, criterion, f"{context}: {path}")
        else:
            _check_constant(value, ref, reference is not None, tolerance_fn, f"{context}: {path}", returned or {},
                            criterion)


# ------------------------------------------------------------------------------------------ constants
def _check_constant(
    value: Any, ref: Any, has_reference: bool, tolerance_fn: ToleranceFn, where: str, returned: dict[int, Any],
    criterion: Criterion | None = None,
) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        if not (isinstance(ref, float) and ((math.isnan(ref) and math.isnan(value)) or ref == value)):
            expected = f" (expected {ref!r})" if has_reference else ""
            raise ValidationError(f"{where} is not finite: {value!r}{expected}")
        return
    if not has_reference:
        return
    if isinstance(value, (bool, int)) and isinstance(ref, (bool, int)) and type(value) is type(ref):
        if value != ref:
            raise ValidationError(f"{where} differs: got {value!r}, expected {ref!r}")
        return
    if isinstance(value, (int, float)) and isinstance(ref, (int, float)) and not isinstance(value, bool):
        tol = tolerance_fn(torch.float32)
        if not (math.isfinite(ref) and abs(value - ref) <= tol.atol + tol.rtol * abs(ref)):
            raise ValidationError(
                f"{where} differs: got {value!r}, expected {ref!r} (abs error {abs(value - ref):.3g}, {tol})"
            )
        return
    if type(value) is not type(ref):
        raise ValidationError(f"{where} has type {type(value).__name__}, expected {type(ref).__name__}")
    if isinstance(value, _SIMPLE):
        if value != ref:
            raise ValidationError(f"{where} differs: got {value!r}, expected {ref!r}")
        return
    _check_opaque(value, ref, where, returned, tolerance_fn, criterion)


def _check_opaque(value: Any, ref: Any, where: str, returned: dict[int, Any], tolerance_fn: ToleranceFn,
                  criterion: Criterion | None) -> None:
    """An object the tree walker does not look into: equal by its own `==`, or the same object.

    Its type alone proves nothing (it may hold tensors the backend computed wrongly), so an object that
    cannot be compared fails validation: the backend is not used rather than trusted blindly. An argument object
    the original module returned (`returned`) must be the backend's copy of it; its contents are checked with
    the state the call left in the arguments.
    """
    if value is ref:
        return
    if id(ref) in returned:
        if value is not returned[id(ref)]:
            raise ValidationError(f"{where}: the original module returned its argument object "
                                  f"({type(ref).__name__}) here, the backend another {type(value).__name__}")
        return
    if type(value).__eq__ is object.__eq__:
        if holds_tensors(ref):
            _check_state_object(value, ref, where, tolerance_fn, criterion or Criterion.from_config())
            return
        raise ValidationError(
            f"{where} is a {type(value).__name__} object that aitune cannot compare with the original output "
            "(no __eq__, holds no tensors, and not a container it walks: tuple, list, dict, dataclass, namedtuple)"
        )
    try:
        equal = value == ref
        same = equal if isinstance(equal, bool) else None
    except Exception:  # e.g. an __eq__ that compares tensors inside and raises
        same = None
    if same is None:
        raise ValidationError(f"{where}: {type(value).__name__} objects cannot be compared with == (no plain bool)")
    if not same:
        raise ValidationError(f"{where} differs from the original output ({type(value).__name__} objects not equal)")


def _check_state_object(value: Any, ref: Any, where: str, tolerance_fn: ToleranceFn, criterion: Criterion) -> None:
    """A new object holding tensors (a `DynamicCache` a causal LM returns when called with `use_cache` on): its
    state - every tensor, number and flag reachable from it, and its layout - against the original's."""
    want, got = reachable(ref), reachable(value)
    if set(want.tensors) != set(got.tensors) or object_signature(value) != object_signature(ref):
        raise ValidationError(f"{where}: the backend's {type(value).__name__} holds another layout than the original "
                              "module's")
    for path, tensor in want.tensors.items():
        _check_tensor(got.tensors[path], tensor, None, tolerance_fn, criterion, f"{where}{path}")
    for path, constant in want.constants.items():
        _check_constant(got.constants.get(path), constant, True, tolerance_fn, f"{where}{path}", {}, criterion)


# ------------------------------------------------------------------------------------------ tensors
def _axis_kind(spec: TensorSpec | None, axis: int) -> str:
    if spec is None or axis >= len(spec.shape):
        return "axis"
    name = spec.shape[axis]
    if isinstance(name, str):
        return f"{'batch' if name.startswith('batch') else 'dynamic'} axis {axis} ({name})"
    return f"static axis {axis}"


def _check_shape(value: torch.Tensor, ref: Any, spec: TensorSpec | None, where: str) -> None:
    shape = tuple(value.shape)
    if spec is not None:
        if len(shape) != spec.ndim:
            raise ValidationError(f"{where} has rank {len(shape)} (shape {list(shape)}), expected {spec.ndim} "
                                  f"(spec {list(spec.shape)})")
        for axis, (size, axis_spec) in enumerate(zip(shape, spec.shape)):
            if isinstance(axis_spec, int) and size != axis_spec:
                raise ValidationError(
                    f"{where} has shape {list(shape)}: static axis {axis} must be {axis_spec} (spec {list(spec.shape)})"
                )
    if isinstance(ref, torch.Tensor):
        ref_shape = tuple(ref.shape)
        if shape != ref_shape:
            if len(shape) != len(ref_shape):
                raise ValidationError(f"{where} has shape {list(shape)}, expected {list(ref_shape)} (rank differs)")
            axis = next(i for i, (a, b) in enumerate(zip(shape, ref_shape)) if a != b)
            raise ValidationError(
                f"{where} has shape {list(shape)}, expected {list(ref_shape)}: {_axis_kind(spec, axis)} is "
                f"{shape[axis]}, the original module gave {ref_shape[axis]}"
            )
    elif spec is not None and not spec.shape_in_range(shape):
        raise ValidationError(
            f"{where} has shape {list(shape)} outside the recorded range "
            f"{list(spec.min_shape)}..{list(spec.max_shape)}"
        )


def _is_exact_dtype(dtype: torch.dtype) -> bool:
    return dtype == torch.bool or not (dtype.is_floating_point or dtype.is_complex)


def _check_tensor(
    value: torch.Tensor, ref: Any, spec: TensorSpec | None, tolerance_fn: ToleranceFn, criterion: Criterion, where: str
) -> None:
    if ref is not None and not isinstance(ref, torch.Tensor):
        raise ValidationError(f"{where} is a tensor, the original module returned {type(ref).__name__}")
    expected_dtype = ref.dtype if isinstance(ref, torch.Tensor) else (spec.dtype if spec is not None else value.dtype)
    if value.dtype != expected_dtype:
        raise ValidationError(f"{where} has dtype {value.dtype}, expected {expected_dtype}")
    _check_shape(value, ref, spec, where)
    if value.numel() == 0:
        return

    if _is_exact_dtype(value.dtype):
        if isinstance(ref, torch.Tensor):
            ref_dev = ref.to(value.device)
            diff = value != ref_dev
            if bool(diff.any()):
                bad = int(diff.sum())
                idx = _unravel(int(diff.reshape(-1).nonzero()[0]), value.shape)
                raise ValidationError(
                    f"{where} differs in {bad}/{value.numel()} elements (exact match required for {value.dtype}); "
                    f"first at index {idx}: got {value[idx].item()!r}, expected {ref_dev[idx].item()!r}"
                )
        return

    _check_floats(value, ref if isinstance(ref, torch.Tensor) else None, tolerance_fn(value.dtype), criterion, where)


def _check_floats(
    value: torch.Tensor, ref: torch.Tensor | None, tol: Tolerance, criterion: Criterion, where: str
) -> None:
    """Non-finite values first, then the closeness rule of `criterion.py` (chunked float64 comparison)."""
    wide = torch.complex128 if value.is_complex() else torch.float64
    flat_out = value.detach().reshape(-1)
    flat_ref = ref.detach().to(value.device).reshape(-1) if ref is not None else None
    total = flat_out.numel()
    comparison = FloatComparison(tol, total) if flat_ref is not None else None
    nonfinite_bad = 0
    first_nonfinite = 0
    for start in range(0, total, _CHUNK):
        o = flat_out[start : start + _CHUNK].to(wide)
        bad = ~torch.isfinite(o)
        if flat_ref is not None:
            r = flat_ref[start : start + _CHUNK].to(wide)
            # a non-finite output is only allowed where the reference has the same non-finite value
            bad &= ~((torch.isnan(o) & torch.isnan(r)) | (~torch.isnan(r) & (o == r)))
        count = int(bad.sum())
        if count:
            if not nonfinite_bad:
                first_nonfinite = start + int(bad.nonzero()[0])
            nonfinite_bad += count
            continue
        if comparison is not None and not nonfinite_bad:
            comparison.add(o, r, start)

    if nonfinite_bad:
        at = _unravel(first_nonfinite, value.shape)
        got = flat_out[first_nonfinite].item()
        expected = f", expected {flat_ref[first_nonfinite].item()!r}" if flat_ref is not None else ""
        raise ValidationError(
            f"{where} has {nonfinite_bad} non-finite values (NaN/inf) where the original module's output has none; "
            f"first at index {at}: got {got!r}{expected}"
        )
    if comparison is None or flat_ref is None:
        return
    closeness = comparison.closeness(criterion)
    if closeness.accepted:
        return
    worst, first = comparison.max_abs_at, comparison.first_mismatch or 0
    raise mismatch_error(
        f"{where} differs from the original module's output ({'; '.join(closeness.failed_checks)}): "
        f"{closeness.outliers}/{total} elements outside tolerance ({tol}), {closeness.allowed_outliers} allowed; "
        f"max abs error {closeness.max_abs_error:.3g} at index {_unravel(worst, value.shape)} "
        f"(got {flat_out[worst].item():.6g}, expected {flat_ref[worst].item():.6g}), cap {closeness.cap:.3g}; "
        f"relative L2 error {closeness.rel_l2:.3g} (limit {closeness.rel_l2_limit:.3g}); "
        f"max rel error {closeness.max_rel_error:.3g}; first mismatch at index {_unravel(first, value.shape)} "
        f"(got {flat_out[first].item():.6g}, expected {flat_ref[first].item():.6g})",
        closeness,
        where,
    )


def _unravel(flat_index: int, shape: torch.Size) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat_index % size if size else 0)
        flat_index = flat_index // size if size else 0
    return tuple(reversed(index))
