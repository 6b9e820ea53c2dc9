"""Range headroom: varying axes served over the powers of two around their recorded range, nothing else widened."""

import pytest
import torch

from aitune_core.recording.graph_recorder import GraphRecorder
from aitune_core.specs.range_headroom import widened_bounds, with_headroom


def forward(input_ids, mask):
    return input_ids.float() * mask


def _spec(shapes):
    recorder = GraphRecorder(forward)
    for batch, length in shapes:
        ids = torch.ones(batch, length, dtype=torch.long)
        recorder.record((ids, torch.ones(batch, length)), {}, torch.ones(batch, length), batch_size=batch)
    return recorder.graph_specs[0]


@pytest.mark.parametrize(("low", "high", "expected"), [
    (35, 57, (32, 64)), (33, 120, (32, 128)), (64, 100, (64, 128)), (2, 3, (2, 4)), (3, 4, (2, 4)),
    (1, 5, (1, 8)), (8, 8, (8, 8)), (1, 1, (1, 1)), (64, 128, (64, 128)),
])
def test_bounds_are_the_powers_of_two_around_a_varying_range(low, high, expected):
    assert widened_bounds(low, high) == expected


def test_a_varying_sequence_axis_is_served_over_its_power_of_two_bounds():
    recorded = _spec([(8, 35), (8, 57)])
    spec = with_headroom(recorded)
    ids = spec.input_spec.tensors[0]
    assert (ids.min_shape, ids.max_shape) == ((8, 32), (8, 64))  # the batch of 8 never varied: kept
    assert spec.output_spec.tensors[0].max_shape == (8, 64)
    assert spec.name == recorded.name and spec.identity() == recorded.identity()

    def call(batch, length):
        return (torch.ones(batch, length, dtype=torch.long), torch.ones(batch, length)), {}

    assert spec.accepts(*call(8, 32)) and spec.accepts(*call(8, 64))
    assert not recorded.accepts(*call(8, 64))
    assert not spec.accepts(*call(8, 65)) and not spec.accepts(*call(8, 31)) and not spec.accepts(*call(4, 40))


def test_a_graph_that_never_varied_is_returned_unchanged():
    recorded = _spec([(8, 35), (8, 35)])
    assert with_headroom(recorded) is recorded


def _linked_spec(second_length):
    def linked(x, y):
        return x.sum() + y.sum()

    recorder = GraphRecorder(linked)
    for length in (35, 57):
        x, y = torch.ones(2, length), torch.ones(2, second_length(length))
        recorder.record((x, y), {}, torch.ones(2, length), batch_size=2)
    return recorder.graph_specs[0]


def test_axes_that_vary_together_keep_their_relation():
    spec = with_headroom(_linked_spec(lambda length: length + 1))  # a mask one longer than the input
    x, y = spec.input_spec.tensors
    assert (x.min_shape[1], x.max_shape[1]) == (32, 64) and (y.min_shape[1], y.max_shape[1]) == (33, 65)


def test_axes_of_other_relations_stay_as_recorded():
    recorded = _linked_spec(lambda length: 2 * length)
    assert with_headroom(recorded) is recorded
