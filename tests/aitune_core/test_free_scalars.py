import pytest
import torch

from aitune_core.specs.free_scalars import (
    FREE_FLOAT,
    FREE_INT,
    free_locators,
    free_values,
    freed,
    is_free,
    loose_identity,
    loose_key,
    marker_for,
)
from aitune_core.specs.sample_metadata import SampleMetadata
from aitune_core.specs.tree import flatten_values


def _leaves(value):
    return flatten_values(value)


def test_only_ints_and_floats_have_markers():
    assert marker_for(3) is FREE_INT and marker_for(0.5) is FREE_FLOAT
    for value in (True, False, None, "a", b"x", torch.float32, [1]):
        assert marker_for(value) is None
    assert is_free(FREE_INT) and not is_free(3)
    assert loose_key(3) == loose_key(999) != loose_key(3.0)
    assert loose_key(True) != loose_key(False)  # a flag picks a code path: its value stays identity


def test_loose_identity_ignores_numeric_values_only():
    x = torch.randn(2, 3)
    a, tree = _leaves({"x": x, "t": 999, "mode": "fast"})
    b, _ = _leaves({"x": torch.randn(5, 3), "t": 979, "mode": "fast"})
    c, _ = _leaves({"x": x, "t": 999, "mode": "slow"})
    assert loose_identity(a, tree) == loose_identity(b, tree) != loose_identity(c, tree)


@pytest.mark.parametrize("later", [979, 979.0])
def test_freed_replaces_the_values_that_differ(later):
    values, tree = _leaves({"x": torch.randn(2, 3), "t": 999, "scale": 0.5})
    meta = SampleMetadata.from_leaves(values, tree)
    same, _ = _leaves({"x": torch.randn(2, 3), "t": 999, "scale": 0.5})
    assert freed(meta, same) is None
    other, _ = _leaves({"x": torch.randn(2, 3), "t": later, "scale": 0.5})
    result = freed(meta, other)
    if isinstance(later, float):  # another type: not this graph's value (the recorder's loose identity differs)
        assert result is None
        return
    assert free_locators(result) == ["t"]
    assert [v for _, v in result.constants][1] == 0.5  # the unchanged value stays identity
    assert free_values(result, other) == (979,)
    assert freed(result, _leaves({"x": torch.randn(2, 3), "t": 5, "scale": 0.5})[0]) is None  # already free
