"""Validation tolerances: `Tolerance(rtol, atol)` and dtype-aware defaults.

The element-wise bound is ``|out - ref| <= atol + rtol * |ref|`` (the `torch.allclose` rule, evaluated on float64
copies), ``ref`` being the ORIGINAL module's output recorded for the same sample. `criterion.py` builds the rule a
floating tensor must meet from it: the whole tensor within the bound in L2 norm, at most a small fraction of
elements outside the bound, none off by more than the bound at the tensor's largest value.

Default tolerances (`default_tolerance(dtype, device)`):

| output dtype | rtol | atol |
| --- | --- | --- |
| float64 | 1e-5 | 1e-6 |
| float32 (CPU, or CUDA with TF32 off) | 1e-3 | 1e-4 |
| float32 on CUDA with TF32 allowed | 1e-2 | 1e-3 |
| float16 | 1e-2 | 1e-2 |
| bfloat16 | 5e-2 | 5e-2 |
| float8 (any variant) | 1.25e-1 | 1e-1 |
| complex | as its real component dtype | |
| integer, bool | 0 | 0 (exact) |
| quantizing backends, floating outputs | >= 1e-1 | >= 1e-1 |

Why these values:

- float64: reordered reductions move results by ~1e-13; the margin is for fused ops.
- float32: Inductor's fused and reordered fp32 kernels differ from eager by ~1e-6 relative on CPU (and on GPU
  without TF32); 1e-3 / 1e-4 leaves a 100x margin and still catches real bugs (wrong op, wrong weights).
- float32 with TF32: TF32 rounds matmul/conv inputs to 10 mantissa bits (~5e-4 per product). Eager convolutions
  already use TF32 by default (`torch.backends.cudnn.allow_tf32`) and a compiled graph may pick other algorithms,
  so two TF32 paths differ by a few 1e-3 after many layers.
- float16: epsilon ~1e-3; fused kernels keep fp32 intermediates where eager rounds after every op, which moves
  outputs by a few ulps per layer. Autocast backends validate fp32 outputs with the autocast dtype's tolerance,
  and so does every backend of a graph the program calls under `torch.autocast` (`under_autocast`): its fp32
  outputs (a LayerNorm's, which autocast runs in fp32) come out of reduced-precision matmuls, and a compiler
  that fuses them rounds at other places (GPT-2 under bf16 autocast: relative L2 error 2.6e-3 between Inductor
  and eager, both under autocast).
- bfloat16: epsilon ~8e-3, so one ulp is already up to 0.8 %, and errors grow with depth: a 12-layer BERT-base
  under bf16 autocast puts a few dozen of its millions of hidden-state elements up to ~0.03 away from fp32
  eager, mostly near zero; 5e-2 leaves margin for that while a wrong op or wrong weights still miss by O(1).
- float8: 2-3 mantissa bits.
- quantizing backends compare against the un-quantized reference, so they get `quantized_tolerance`.

"TF32 allowed" means the output lives on a CUDA device and any of `torch.backends.cuda.matmul.allow_tf32`,
`torch.backends.cudnn.allow_tf32` (on by default) or `torch.get_float32_matmul_precision() != "highest"` is set.

Quantizing backends (TorchAO int8/fp8, TensorRT int8) compare against an un-quantized reference, so they use
`quantized_tolerance(dtype)`: at least rtol 1e-1 / atol 1e-1 for floating outputs (integer outputs stay exact).

Overrides (`aitune_core.config.config`): `rtol` / `atol` replace the floating-point defaults above for every
backend that does not quantize; `quantized_rtol` / `quantized_atol` replace the quantized ones. `None` keeps the
default. Integer and bool outputs are always compared exactly.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable, Sequence

import torch


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Relative and absolute tolerance of one comparison (`|out - ref| <= atol + rtol * |ref|`)."""

    rtol: float
    atol: float

    def __post_init__(self) -> None:
        for field in ("rtol", "atol"):
            value = getattr(self, field)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
                raise ValueError(f"Tolerance.{field} must be a finite number >= 0, got {value!r}")

    @property
    def exact(self) -> bool:
        return self.rtol == 0 and self.atol == 0

    def widen(self, other: Tolerance) -> Tolerance:
        """The looser of two tolerances, field by field."""
        return Tolerance(max(self.rtol, other.rtol), max(self.atol, other.atol))

    def __str__(self) -> str:
        return f"rtol={self.rtol:g}, atol={self.atol:g}"


EXACT = Tolerance(0.0, 0.0)

_FLOAT_DEFAULTS: dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(1e-5, 1e-6),
    torch.float32: Tolerance(1e-3, 1e-4),
    torch.float16: Tolerance(1e-2, 1e-2),
    torch.bfloat16: Tolerance(5e-2, 5e-2),
}
TF32_TOLERANCE = Tolerance(1e-2, 1e-3)
FLOAT8_TOLERANCE = Tolerance(1.25e-1, 1e-1)
QUANTIZED_TOLERANCE = Tolerance(1e-1, 1e-1)

_COMPLEX_TO_REAL = {
    torch.complex128: torch.float64,
    torch.complex64: torch.float32,
    torch.complex32: torch.float16,
}


def _config_value(name: str) -> float | None:
    try:
        from aitune_core.config import config
    except ImportError:  # pragma: no cover - config is part of the core
        return None
    value = getattr(config, name, None)
    return None if value is None else float(value)


def tf32_possible(device: torch.device | str | None) -> bool:
    """True when fp32 matmuls/convs on `device` may run in TF32 (see the module table)."""
    if device is None or torch.device(device).type != "cuda":
        return False
    with warnings.catch_warnings():  # the allow_tf32 flags are being replaced by fp32_precision in newer torch
        warnings.simplefilter("ignore")
        try:
            return bool(
                torch.backends.cuda.matmul.allow_tf32
                or torch.backends.cudnn.allow_tf32
                or torch.get_float32_matmul_precision() != "highest"
            )
        except Exception:
            return True


def _is_integral(dtype: torch.dtype) -> bool:
    return dtype == torch.bool or not (dtype.is_floating_point or dtype.is_complex)


def _builtin_float_tolerance(dtype: torch.dtype, device: torch.device | str | None) -> Tolerance:
    dtype = _COMPLEX_TO_REAL.get(dtype, dtype)
    if dtype == torch.float32 and tf32_possible(device):
        return TF32_TOLERANCE
    if dtype in _FLOAT_DEFAULTS:
        return _FLOAT_DEFAULTS[dtype]
    if dtype.itemsize == 1:  # float8 variants (e4m3fn, e5m2, ...)
        return FLOAT8_TOLERANCE
    return _FLOAT_DEFAULTS[torch.float32]


def default_tolerance(dtype: torch.dtype, device: torch.device | str | None = None) -> Tolerance:
    """Tolerance for outputs of `dtype` (on `device`, which decides whether TF32 applies); see the module table."""
    if _is_integral(dtype):
        return EXACT
    base = _builtin_float_tolerance(dtype, device)
    rtol, atol = _config_value("rtol"), _config_value("atol")
    return Tolerance(base.rtol if rtol is None else rtol, base.atol if atol is None else atol)


def quantized_tolerance(dtype: torch.dtype, device: torch.device | str | None = None) -> Tolerance:
    """Tolerance for backends that quantize weights or activations (config `quantized_rtol`/`quantized_atol`)."""
    if _is_integral(dtype):
        return EXACT
    base = _builtin_float_tolerance(dtype, device).widen(QUANTIZED_TOLERANCE)
    rtol, atol = _config_value("quantized_rtol"), _config_value("quantized_atol")
    return Tolerance(base.rtol if rtol is None else rtol, base.atol if atol is None else atol)


def under_autocast(
    tolerance_fn: Callable[[torch.dtype], Tolerance], dtypes: Sequence[torch.dtype]
) -> Callable[[torch.dtype], Tolerance]:
    """`tolerance_fn` widened, for floating outputs, to the tolerance of each autocast dtype in `dtypes` (the
    graph's calls ran under `torch.autocast`; see the module docstring)."""
    if not dtypes:
        return tolerance_fn

    def widened(dtype: torch.dtype) -> Tolerance:
        base = tolerance_fn(dtype)
        if _is_integral(dtype):
            return base
        for cast in dtypes:
            base = base.widen(default_tolerance(cast))
        return base

    return widened
