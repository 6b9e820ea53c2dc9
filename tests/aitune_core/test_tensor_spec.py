import json

import pytest
import torch

from aitune_core.specs.tensor_spec import TensorSpec, dtype_from_str


def test_from_tensor_is_static():
    spec = TensorSpec.from_tensor(torch.ones(2, 3, dtype=torch.float16), locator="[0]", name="args_0")
    assert spec.shape == spec.min_shape == spec.max_shape == (2, 3)
    assert spec.dtype == torch.float16 and spec.device == torch.device("cpu")
    assert spec.is_static() and spec.non_static_axes() == []


def test_axis_kinds_and_range():
    spec = TensorSpec("", "x", ("batch0", "dim1", 512), (1, 10, 512), (4, 50, 512), torch.float32)
    assert spec.batch_axes() == [0]
    assert spec.dynamic_axes() == [1]
    assert spec.non_static_axes() == [0, 1]
    assert spec.shape_in_range((2, 50, 512))
    assert not spec.shape_in_range((5, 10, 512))
    assert not spec.shape_in_range((2, 10, 256))
    assert not spec.shape_in_range((2, 10))


def test_json_round_trip():
    spec = TensorSpec("['x']", "x", ("batch0", 3), (1, 3), (8, 3), torch.bfloat16, torch.device("cpu"))
    assert TensorSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert spec.to_dict()["dtype"] == "torch.bfloat16"


def test_dtype_from_str():
    assert dtype_from_str("torch.int64") is torch.int64
    assert dtype_from_str("float16") is torch.float16
    with pytest.raises(ValueError):
        dtype_from_str("torch.nope")
