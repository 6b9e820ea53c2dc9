"""Optimization-profile derivation from GraphSpecs (pure logic, no TensorRT needed)."""

import json

import pytest
import torch
from backend_models import TransformerBlock, block_call, mlp_call, record

from aitune_core.backends.trt_profiles import (
    ShapeRange,
    derive_profiles,
    most_frequent_shapes,
    profiles_from_dict,
    profiles_from_graph_spec,
    profiles_to_dict,
)


class Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc(x)


def test_min_max_from_recorded_extremes_opt_from_most_frequent_batch():
    torch.manual_seed(0)
    spec, samples = record(Linear(), mlp_call, batch_sizes=(2, 8, 8, 8, 4, 16))
    profiles = profiles_from_graph_spec(spec, samples)
    assert list(profiles) == ["x"]
    assert profiles["x"] == ShapeRange(min=(2, 32), opt=(8, 32), max=(16, 32))


def test_opt_keeps_related_axes_of_one_call_together():
    # input and mask share batch and sequence length; opt must come from one recorded call for both
    torch.manual_seed(0)
    calls = [(2, 8), (4, 16), (4, 16), (8, 4)]
    shapes = iter(calls)

    def make_call(_batch):
        batch, seq = next(shapes)
        return block_call(batch, seq=seq)

    spec, samples = record(TransformerBlock(), make_call, batch_sizes=[b for b, _ in calls])
    profiles = profiles_from_graph_spec(spec, samples)
    assert profiles["x"] == ShapeRange((2, 4, 64), (4, 16, 64), (8, 16, 64))
    assert profiles["mask"] == ShapeRange((2, 4), (4, 16), (8, 16))


def test_static_axes_have_equal_min_opt_max():
    torch.manual_seed(0)
    spec, samples = record(Linear(), mlp_call, batch_sizes=(4, 4))
    profile = profiles_from_graph_spec(spec, samples)["x"]
    assert profile.min == profile.opt == profile.max == (4, 32)
    assert profile.is_static


def test_ties_go_to_the_larger_combination_then_first_seen():
    observed = [[(2, 3)], [(8, 3)], [(4, 3)], [(8, 3)], [(2, 3)]]
    assert most_frequent_shapes(observed) == ((8, 3),)
    assert most_frequent_shapes([[(2, 3), (1,)], [(2, 3), (1,)]]) == ((2, 3), (1,))
    assert most_frequent_shapes([]) is None


def test_without_samples_opt_is_max():
    profiles = derive_profiles(["a"], [(1, 5)], [(8, 5)])
    assert profiles["a"] == ShapeRange((1, 5), (8, 5), (8, 5))


def test_observed_shapes_outside_the_extremes_are_a_bug():
    with pytest.raises(ValueError, match="outside the recorded range"):
        derive_profiles(["a"], [(1, 5)], [(8, 5)], [[(16, 5)]])
    with pytest.raises(ValueError, match="inputs"):
        derive_profiles(["a"], [(1, 5)], [(8, 5)], [[(2, 5), (2, 5)]])
    with pytest.raises(ValueError, match="names"):
        derive_profiles(["a", "b"], [(1, 5)], [(8, 5)])


def test_shape_range_checks_order_and_rank():
    with pytest.raises(ValueError, match="min <= opt <= max"):
        ShapeRange((4,), (2,), (8,))
    with pytest.raises(ValueError, match="ranks"):
        ShapeRange((1,), (2, 2), (3,))
    r = ShapeRange((1, 3), (4, 3), (8, 3))
    assert r.contains((8, 3)) and not r.contains((9, 3)) and not r.contains((4,))


def test_profiles_round_trip_through_json():
    profiles = {"x": ShapeRange((1, 3), (4, 3), (8, 3)), "mask": ShapeRange((2,), (2,), (2,))}
    assert profiles_from_dict(json.loads(json.dumps(profiles_to_dict(profiles)))) == profiles
