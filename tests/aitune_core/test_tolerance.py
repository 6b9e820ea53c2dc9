import pytest
import torch

from aitune_core.config import config
from aitune_core.validation.tolerance import (
    TF32_TOLERANCE,
    Tolerance,
    default_tolerance,
    quantized_tolerance,
    tf32_possible,
)


def test_tolerance_is_a_validated_frozen_dataclass():
    tol = Tolerance(1e-3, 1e-4)
    with pytest.raises(AttributeError):
        tol.rtol = 1.0  # type: ignore[misc]
    for bad in (-1.0, float("nan"), float("inf"), True, "1"):
        with pytest.raises(ValueError):
            Tolerance(bad, 0.0)  # type: ignore[arg-type]
    assert Tolerance(0, 0).exact and not tol.exact
    assert tol.widen(Tolerance(1e-2, 0)) == Tolerance(1e-2, 1e-4)


def test_defaults_follow_the_dtype():
    fp32, fp16, bf16 = (default_tolerance(d) for d in (torch.float32, torch.float16, torch.bfloat16))
    assert fp32 == Tolerance(1e-3, 1e-4)
    assert fp16 == Tolerance(1e-2, 1e-2)
    assert bf16 == Tolerance(5e-2, 5e-2)
    assert default_tolerance(torch.float64).rtol < fp32.rtol < fp16.rtol < bf16.rtol
    assert default_tolerance(torch.float8_e4m3fn).rtol > bf16.rtol
    assert default_tolerance(torch.complex64) == fp32
    for dtype in (torch.int64, torch.int32, torch.uint8, torch.bool):
        assert default_tolerance(dtype).exact


def test_tf32_widens_fp32_on_cuda_only(monkeypatch):
    assert not tf32_possible("cpu") and not tf32_possible(None)
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    assert tf32_possible("cuda:0")
    assert default_tolerance(torch.float32, "cuda:0") == TF32_TOLERANCE
    assert default_tolerance(torch.float32, "cpu") == Tolerance(1e-3, 1e-4)
    assert default_tolerance(torch.float16, "cuda:0") == Tolerance(1e-2, 1e-2)


def test_config_overrides():
    with config.override(rtol=0.5, atol=0.25):
        assert default_tolerance(torch.float32) == Tolerance(0.5, 0.25)
        assert default_tolerance(torch.bfloat16) == Tolerance(0.5, 0.25)
        assert default_tolerance(torch.int64).exact
    with config.override(atol=0.0):
        assert default_tolerance(torch.float32) == Tolerance(1e-3, 0.0)
    assert default_tolerance(torch.float32) == Tolerance(1e-3, 1e-4)


def test_quantized_tolerance():
    assert quantized_tolerance(torch.float32) == Tolerance(0.1, 0.1)
    assert quantized_tolerance(torch.int8).exact
    with config.override(quantized_rtol=0.3, quantized_atol=0.2):
        assert quantized_tolerance(torch.float16) == Tolerance(0.3, 0.2)
