"""When a floating-point output tensor is close enough to the original module's, and how close it was.

A pure element-wise rule (`|out - ref| <= atol + rtol * |ref|` for every element) rejects correct backends: a
reordered or TF32 reduction moves every element a little, and an element whose reference is (close to) zero has
only `atol` of room, so in a large tensor one such element lands outside while the whole tensor is off by a
fraction of `rtol`. Loosening `atol` for everybody would hide real bugs. The rule here instead accepts a tensor
when all three of these hold, with `(rtol, atol)` the backend's `Tolerance` for the output's dtype (which already
scales with the dtype, TF32 and quantization, see `tolerance.py`):

(a) whole tensor: `||out - ref||_2 <= || atol + rtol * |ref| ||_2`, the element-wise allowance measured as one
    vector. Relative to the reference this is about `rtol` (plus `atol` per element); a tensor that passes the
    element-wise rule always passes it.
(b) few outliers: at most `floor(outlier_fraction * numel)` elements are outside the element-wise bound
    (default `outlier_fraction` 1e-2: 327 of 32768; a tensor under 100 elements gets none, so small outputs keep
    the strict element-wise rule).
(c) no element far off: every element's error is at most `outlier_cap * (atol + rtol * max|ref|)` (default
    `outlier_cap` 1.0): an outlier may be off by as much as the tolerance allows the tensor's largest element,
    never more. A backend wrong in a few elements by a lot fails here.

A non-finite output where the reference has another value (and a finite output where the reference is NaN or
infinite) always fails. Integer and bool outputs are compared exactly elsewhere (`validator.py`), and
`outlier_fraction = 0` gives back the strict element-wise rule. The knobs are `config.outlier_fraction` and
`config.outlier_cap` (`aitune_core.config`); `Criterion.from_config()` reads them.

`FloatComparison` accumulates the statistics chunk by chunk (float64 copies of whole outputs are never needed at
once) and `Closeness` is the result: whether the tensor passed and, when it did not, how close it came (relative L2
error and its limit, outlier count and allowance, worst error and its cap). `mismatch_error` makes the
`ValidationError` that carries it (attributes `closeness` and `closeness_summary`), so a strategy can report how
close a rejected candidate was.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from aitune_core.errors import ValidationError
from aitune_core.validation.tolerance import Tolerance

#: TF32 convolutions put a correct backend's near-zero elements outside the element-wise bound: an SD-1.5-shaped
#: UNet under Inductor on an H100 had 0.12-0.24 % of its elements there on inputs it was not validated on (whole-tensor
#: error 1.2e-3, a tenth of its bound; worst element a sixth of the cap; benchmarks/real_workloads). 1 % leaves room;
#: the L2 bound and the cap still catch a backend wrong in a few elements by a lot.
DEFAULT_OUTLIER_FRACTION = 1e-2
DEFAULT_OUTLIER_CAP = 1.0
_TINY = torch.finfo(torch.float64).tiny


@dataclasses.dataclass(frozen=True)
class Criterion:
    """The knobs of the rule in the module docstring: allowed outlier fraction and the outliers' error cap."""

    outlier_fraction: float = DEFAULT_OUTLIER_FRACTION
    outlier_cap: float = DEFAULT_OUTLIER_CAP

    def __post_init__(self) -> None:
        fraction, cap = self.outlier_fraction, self.outlier_cap
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
            raise ValueError(f"Criterion.outlier_fraction must be a number in [0, 1], got {fraction!r}")
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not math.isfinite(cap) or cap < 0:
            raise ValueError(f"Criterion.outlier_cap must be a finite number >= 0, got {cap!r}")

    @classmethod
    def from_config(cls) -> Criterion:
        """The criterion set by `aitune_core.config.config` (`outlier_fraction`, `outlier_cap`)."""
        from aitune_core.config import config

        return cls(config.outlier_fraction, config.outlier_cap)

    def allowed_outliers(self, numel: int) -> int:
        """How many elements of a tensor of `numel` elements may be outside the element-wise bound."""
        return math.floor(self.outlier_fraction * numel + 1e-9)


@dataclasses.dataclass(frozen=True)
class Closeness:
    """How close one output tensor came to the reference, and which part of the rule it failed."""

    numel: int
    outliers: int  # elements outside the element-wise bound
    allowed_outliers: int
    max_abs_error: float
    cap: float  # the largest error any element may have (rule c)
    l2_error: float  # ||out - ref||_2
    l2_limit: float  # || atol + rtol*|ref| ||_2 (rule a)
    ref_l2: float  # ||ref||_2
    max_rel_error: float
    tolerance: Tolerance
    non_finite_mismatches: int = 0  # a finite output where the reference is NaN/inf, or vice versa

    @property
    def rel_l2(self) -> float:
        """The whole-tensor relative error `||out - ref||_2 / ||ref||_2` (inf for an all-zero reference)."""
        return _ratio(self.l2_error, self.ref_l2)

    @property
    def rel_l2_limit(self) -> float:
        """Rule (a)'s limit on `rel_l2`: about `rtol`, more where `atol` dominates."""
        return _ratio(self.l2_limit, self.ref_l2)

    @property
    def failed_checks(self) -> list[str]:
        """The parts of the rule this tensor failed (empty: it passed)."""
        failed = []
        if self.non_finite_mismatches:
            failed.append(f"{self.non_finite_mismatches} element(s) finite where the original's is NaN/inf")
        if self.l2_error > self.l2_limit:
            failed.append("whole-tensor L2 error above its limit")
        if self.outliers > self.allowed_outliers:
            failed.append("too many elements outside the element-wise tolerance")
        if self.max_abs_error > self.cap:
            failed.append("an element off by more than the cap")
        return failed

    @property
    def accepted(self) -> bool:
        return not self.failed_checks

    def summary(self) -> str:
        """One line for a history, e.g. `rel L2 error 0.0007 (limit 0.011); 1/32768 elements outside rtol=0.01,
        atol=0.001 (allowed 32); max abs error 0.0021 (cap 0.041)`."""
        return (
            f"rel L2 error {self.rel_l2:.2g} (limit {self.rel_l2_limit:.2g}); "
            f"{self.outliers}/{self.numel} elements outside {self.tolerance} (allowed {self.allowed_outliers}); "
            f"max abs error {self.max_abs_error:.3g} (cap {self.cap:.3g})"
        )


def _ratio(numerator: float, denominator: float) -> float:
    if denominator > 0:
        return numerator / denominator
    return 0.0 if numerator == 0 else math.inf


def mismatch_error(message: str, closeness: Closeness, where: str = "") -> ValidationError:
    """The `ValidationError` for an output whose values are not close enough.

    It stays a plain `ValidationError` (callers tell failures apart by that class) and carries two attributes:
    `closeness` (the `Closeness`) and `closeness_summary` (`where: closeness.summary()`, the one line a strategy
    copies into its candidate report). Other validation errors have neither.
    """
    error = ValidationError(message)
    error.closeness = closeness  # type: ignore[attr-defined]
    summary = f"{where}: {closeness.summary()}" if where else closeness.summary()
    error.closeness_summary = summary  # type: ignore[attr-defined]
    return error


class FloatComparison:
    """Statistics of `out` against `ref` for one floating (or complex) tensor, fed chunk by chunk (float64 copies)."""

    def __init__(self, tolerance: Tolerance, numel: int) -> None:
        self.tolerance = tolerance
        self.numel = numel
        self.outliers = 0
        self.non_finite_mismatches = 0
        self.max_abs_error = 0.0
        self.max_abs_at = 0
        self.max_rel_error = 0.0
        self.max_ref = 0.0
        self.first_mismatch: int | None = None
        self._err_sq = 0.0
        self._allow_sq = 0.0
        self._ref_sq = 0.0

    def add(self, out: torch.Tensor, ref: torch.Tensor, start: int) -> None:
        """Add one 1-D chunk (float64 / complex128) of output and reference that starts at flat index `start`."""
        zero = torch.zeros((), dtype=torch.float64, device=out.device)
        finite_r = torch.isfinite(ref)
        both_finite = torch.isfinite(out) & finite_r
        same_special = (torch.isnan(out) & torch.isnan(ref)) | (~finite_r & ~torch.isnan(ref) & (out == ref))
        special_bad = ~both_finite & ~same_special
        abs_ref = torch.where(finite_r, ref.abs(), zero)
        abs_err = torch.where(both_finite, (out - ref).abs(), zero)
        allowed = self.tolerance.atol + self.tolerance.rtol * abs_ref
        mismatch = (abs_err > allowed) | special_bad

        self.outliers += int(mismatch.sum())
        self.non_finite_mismatches += int(special_bad.sum())
        self._err_sq += float(abs_err.square().sum())
        self._allow_sq += float(allowed.square().sum())
        self._ref_sq += float(abs_ref.square().sum())
        self.max_ref = max(self.max_ref, float(abs_ref.max()))
        chunk_max, chunk_at = torch.max(abs_err, dim=0)
        if float(chunk_max) > self.max_abs_error:
            self.max_abs_error, self.max_abs_at = float(chunk_max), start + int(chunk_at)
        rel = torch.where(abs_err > 0, abs_err / abs_ref.clamp_min(_TINY), zero)
        self.max_rel_error = max(self.max_rel_error, float(rel.max()))
        if self.first_mismatch is None and bool(mismatch.any()):
            self.first_mismatch = start + int(mismatch.nonzero()[0])

    def closeness(self, criterion: Criterion) -> Closeness:
        """The result once every chunk was added."""
        tol = self.tolerance
        return Closeness(
            numel=self.numel,
            outliers=self.outliers,
            allowed_outliers=criterion.allowed_outliers(self.numel),
            max_abs_error=self.max_abs_error,
            cap=criterion.outlier_cap * (tol.atol + tol.rtol * self.max_ref),
            l2_error=math.sqrt(self._err_sq),
            l2_limit=math.sqrt(self._allow_sq),
            ref_l2=math.sqrt(self._ref_sq),
            max_rel_error=self.max_rel_error,
            tolerance=tol,
            non_finite_mismatches=self.non_finite_mismatches,
        )
