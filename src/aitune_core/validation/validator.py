"""Correctness check of a built backend against the outputs the ORIGINAL module produced when recording.

`validate_backend(backend, graph_spec, data, tolerance_fn)` runs every sample through the backend and checks, for
every leaf of the (nested) output:

1. structure: the output has the same layout (containers, keys, field names, leaf kinds) as the recorded output;
2. Python ints / floats are finite, tensors are finite - except where the recorded reference has the same
   non-finite value at the same place (NaN where the reference is NaN, the same infinity);
3. tensors have the recorded dtype and a shape consistent with the output spec: the rank, every static axis, and
   every batch / dynamic axis equal to the reference's size for that sample (within the spec's [min, max] when a
   sample has no reference);
4. values agree with `sample.output`: `|out - ref| <= atol + rtol * |ref|` element-wise on float64 copies (complex:
   complex128), with `(rtol, atol) = tolerance_fn(dtype)`; integers and bools exactly; other constants by value for
   simple types (None, str, bool, ...) and by type otherwise (e.g. a cache object in a model output).

The first failure raises `ValidationError` naming the backend, the sample, the output path, and for value
mismatches the number of bad elements, the max absolute and relative errors with their index and values.
Large tensors are compared in chunks, so validation does not need float64 copies of whole outputs at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from aitune_core.errors import ValidationError
from aitune_core.specs.tree import TENSOR, flatten
from aitune_core.validation.tolerance import Tolerance

if TYPE_CHECKING:
    from aitune_core.backends.backend import Backend
    from aitune_core.recording.sample import Sample
    from aitune_core.specs.graph_spec import GraphSpec
    from aitune_core.specs.sample_metadata import SampleMetadata
    from aitune_core.specs.tensor_spec import TensorSpec

ToleranceFn = Callable[[torch.dtype], Tolerance]

_CHUNK = 1 << 22  # elements per float64 comparison chunk
_SIMPLE = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)


def validate_backend(
    backend: Backend,
    graph_spec: GraphSpec,
    data: Sequence[Sample],
    tolerance_fn: ToleranceFn | None = None,
) -> None:
    """Run every sample through `backend` and check its outputs (see the module docstring).

    `tolerance_fn(dtype)` defaults to `backend.tolerance`. Raises `ValidationError` on the first problem.
    """
    tolerance_fn = tolerance_fn or backend.tolerance
    device = backend.device
    if not data:
        raise ValidationError(f"{backend.describe()}: no samples to validate graph {graph_spec.name} with")
    with torch.no_grad():
        for index, sample in enumerate(data):
            args, kwargs = sample.inputs_to(device) if device is not None else (sample.args, sample.kwargs)
            try:
                output = backend.infer(*args, **kwargs)
            except ValidationError:
                raise
            except Exception as exc:
                raise ValidationError(
                    f"{backend.describe()} failed on sample {index} of graph {graph_spec.name}: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            validate_output(
                output,
                sample.output,
                graph_spec.output_spec,
                tolerance_fn,
                context=f"{backend.describe()} (graph {graph_spec.name}, sample {index})",
            )


def validate_output(
    output: Any,
    reference: Any,
    output_spec: SampleMetadata | None,
    tolerance_fn: ToleranceFn,
    *,
    context: str = "backend",
) -> None:
    """Check one output against the recorded `reference` (None: only finiteness, structure and the spec's shapes)."""
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
            _check_tensor(value, ref, spec, tolerance_fn, f"{context}: {path}")
        else:
            _check_constant(value, ref, reference is not None, tolerance_fn, f"{context}: {path}")


# ------------------------------------------------------------------------------------------ constants
def _check_constant(value: Any, ref: Any, has_reference: bool, tolerance_fn: ToleranceFn, where: str) -> None:
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
    _check_opaque(value, ref, where)


def _check_opaque(value: Any, ref: Any, where: str) -> None:
    """An object the tree walker does not look into: equal by its own `==`, or the same object.

    Its type alone proves nothing (it may hold tensors the backend computed wrongly), so an object that
    cannot be compared fails validation: the backend is not used rather than trusted blindly.
    """
    if value is ref:
        return
    if type(value).__eq__ is object.__eq__:
        raise ValidationError(
            f"{where} is a {type(value).__name__} object that aitune cannot compare with the original output "
            "(no __eq__, and not a container it walks: tuple, list, dict, dataclass, namedtuple)"
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
    value: torch.Tensor, ref: Any, spec: TensorSpec | None, tolerance_fn: ToleranceFn, where: str
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

    tol = tolerance_fn(value.dtype)
    reference = ref.to(value.device) if isinstance(ref, torch.Tensor) else None
    wide = torch.complex128 if value.is_complex() else torch.float64
    flat_out = value.detach().reshape(-1)
    flat_ref = reference.detach().reshape(-1) if reference is not None else None

    total = flat_out.numel()
    nonfinite_bad = 0
    first_nonfinite: int | None = None
    bad = 0
    max_abs, max_abs_at = -1.0, 0
    max_rel = 0.0
    first_mismatch: int | None = None
    for start in range(0, total, _CHUNK):
        o = flat_out[start : start + _CHUNK].to(wide)
        finite_o = torch.isfinite(o)
        if flat_ref is None:
            nf = ~finite_o
            count = int(nf.sum())
            if count:
                nonfinite_bad += count
                if first_nonfinite is None:
                    first_nonfinite = start + int(nf.nonzero()[0])
            continue
        r = flat_ref[start : start + _CHUNK].to(wide)
        finite_r = torch.isfinite(r)
        same_special = (torch.isnan(o) & torch.isnan(r)) | (~finite_r & ~torch.isnan(r) & (o == r))
        # a non-finite output is only allowed where the reference has the same non-finite value
        nf = ~finite_o & ~same_special
        count = int(nf.sum())
        if count:
            nonfinite_bad += count
            if first_nonfinite is None:
                first_nonfinite = start + int(nf.nonzero()[0])
            continue
        both_finite = finite_o & finite_r
        abs_err = torch.where(both_finite, (o - r).abs(), torch.zeros((), dtype=torch.float64, device=o.device))
        allowed = tol.atol + tol.rtol * torch.where(both_finite, r.abs(), torch.zeros((), dtype=torch.float64,
                                                                                        device=o.device))
        mismatch = (abs_err > allowed) | (~same_special & ~both_finite)  # reference non-finite, output finite
        bad += int(mismatch.sum())
        chunk_max, chunk_at = torch.max(abs_err, dim=0)
        if float(chunk_max) > max_abs:
            max_abs, max_abs_at = float(chunk_max), start + int(chunk_at)
        rel = abs_err / r.abs().clamp_min(torch.finfo(torch.float64).tiny)
        rel = torch.where(both_finite & (abs_err > 0), rel, torch.zeros((), dtype=torch.float64, device=o.device))
        max_rel = max(max_rel, float(rel.max()))
        if first_mismatch is None and bool(mismatch.any()):
            first_mismatch = start + int(mismatch.nonzero()[0])

    if nonfinite_bad:
        at = _unravel(first_nonfinite or 0, value.shape)
        got = flat_out[first_nonfinite or 0].item()
        expected = f", expected {flat_ref[first_nonfinite or 0].item()!r}" if flat_ref is not None else ""
        raise ValidationError(
            f"{where} has {nonfinite_bad} non-finite values (NaN/inf) where the original module's output has none; "
            f"first at index {at}: got {got!r}{expected}"
        )
    if flat_ref is None or not bad:
        return
    at = _unravel(max_abs_at, value.shape)
    first = first_mismatch or 0
    raise ValidationError(
        f"{where} differs from the original module's output: {bad}/{total} elements outside tolerance ({tol}); "
        f"max abs error {max_abs:.3g} at index {at} (got {flat_out[max_abs_at].item():.6g}, expected "
        f"{flat_ref[max_abs_at].item():.6g}); max rel error {max_rel:.3g}; first mismatch at index "
        f"{_unravel(first, value.shape)} (got {flat_out[first].item():.6g}, expected {flat_ref[first].item():.6g})"
    )


def _unravel(flat_index: int, shape: torch.Size) -> tuple[int, ...]:
    index = []
    for size in reversed(shape):
        index.append(flat_index % size if size else 0)
        flat_index = flat_index // size if size else 0
    return tuple(reversed(index))
