import json

import pytest
import torch

from aitune_core.recording.graph_recorder import GraphRecorder
from aitune_core.specs.graph_spec import GraphSpec
from aitune_core.specs.tables import render_graph_spec


def forward(x, mask=None, mode="sum"):
    return x


def _spec(strict=True):
    recorder = GraphRecorder(forward, strict=strict)
    for batch, length in ((1, 10), (4, 50)):
        recorder.record((torch.randn(batch, length, 8),), {"mode": "sum"}, torch.randn(batch, 8), batch_size=batch)
    return recorder.graph_specs[0]


def test_recorded_spec_shape():
    spec = _spec()
    x = spec.input_spec.tensors[0]
    assert (x.name, x.locator, x.shape) == ("x", "['x']", ("batch0", "dim1", 8))
    assert (x.min_shape, x.max_shape) == ((1, 10, 8), (4, 50, 8))
    assert spec.non_static_axes() == {"x": [0, 1]}
    assert spec.has_batch_axis()
    assert spec.output_spec.tensors[0].shape == ("batch0", 8)


def test_accepts_inside_and_outside_range():
    spec = _spec()
    assert spec.accepts((torch.randn(2, 30, 8),), {"mode": "sum"})
    assert spec.accepts((), {"x": torch.randn(4, 10, 8), "mode": "sum"})  # keyword form, range edges
    assert not spec.accepts((torch.randn(5, 30, 8),), {"mode": "sum"})  # batch above max
    assert not spec.accepts((torch.randn(2, 9, 8),), {"mode": "sum"})  # dynamic below min
    assert not spec.accepts((torch.randn(2, 30, 16),), {"mode": "sum"})  # static axis differs
    assert not spec.accepts((torch.randn(2, 30),), {"mode": "sum"})  # rank
    assert not spec.accepts((torch.randn(2, 30, 8, dtype=torch.float64),), {"mode": "sum"})  # dtype
    assert not spec.accepts((torch.randn(2, 30, 8),), {"mode": "mean"})  # strict constant
    assert not spec.accepts((torch.randn(2, 30, 8),), {})  # different set of arguments
    assert not spec.accepts((torch.randn(2, 30, 8), None, "sum", 1), {})  # does not bind


def test_non_strict_ignores_constants():
    spec = _spec(strict=False)
    assert spec.accepts((torch.randn(2, 30, 8),), {"mode": "mean"})


def test_mismatch_names_the_shape():
    spec = _spec()
    assert spec.mismatch((torch.randn(2, 30, 8),), {"mode": "sum"}) is None
    reason = spec.mismatch((torch.randn(9, 30, 8),), {"mode": "sum"})
    assert "x" in reason and "[9, 30, 8]" in reason and "[1, 10, 8]..[4, 50, 8]" in reason
    assert "strict" in spec.mismatch((torch.randn(2, 30, 8),), {"mode": "max"})


def test_json_round_trip_keeps_equality_and_behaviour():
    spec = _spec()
    again = GraphSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec
    assert again.to_dict() == spec.to_dict()
    assert again.input_spec.tensors[0].dtype is torch.float32
    assert again.accepts((torch.randn(2, 30, 8),), {"mode": "sum"})
    assert not again.accepts((torch.randn(2, 30, 8),), {"mode": "mean"})
    assert render_graph_spec(again) == render_graph_spec(spec)


def test_input_tensors_in_spec_order():
    spec = _spec()
    x = torch.randn(2, 30, 8)
    tensors = spec.input_tensors((), {"mode": "sum", "x": x})
    assert len(tensors) == 1 and tensors[0] is x


def test_default_binder_is_generic():
    from aitune_core.specs.sample_metadata import SampleMetadata

    inputs = SampleMetadata.from_value({"args": (torch.ones(2),)})
    spec = GraphSpec("0", inputs, SampleMetadata.from_value(torch.ones(2), names_prefix="outputs"))
    assert spec.input_spec.names == ["args_0"]
    assert spec.accepts((torch.zeros(2),), {})
    assert not spec.accepts((torch.zeros(3),), {})


@pytest.mark.parametrize("calls", [1000])
def test_accepts_is_cheap(calls):
    import time

    spec = _spec()
    x = torch.randn(2, 30, 8)
    start = time.perf_counter()
    for _ in range(calls):
        spec.accepts((x,), {"mode": "sum"})
    per_call = (time.perf_counter() - start) / calls
    assert per_call < 200e-6, f"accepts took {per_call * 1e6:.1f}us per call"


def test_positional_fast_path_keeps_every_check():
    """After a plain `module(x, y)` call is accepted, later such calls skip binding but not the checks."""

    def forward(x, y, scale=1.0):
        return x * scale + y

    recorder = GraphRecorder(forward)
    for batch in (1, 4):
        recorder.record((torch.randn(batch, 8), torch.randn(batch, 8)), {}, None, batch_size=batch)
    (spec,) = recorder.graph_specs
    assert spec.accepts((torch.randn(2, 8), torch.randn(2, 8)), {})  # learns the layout
    assert spec._fast_layouts == {(2, ()): (0, 1)}
    assert spec.accepts((torch.randn(3, 8), torch.randn(3, 8)), {})
    assert not spec.accepts((torch.randn(5, 8), torch.randn(5, 8)), {})  # batch above max
    assert not spec.accepts((torch.randn(2, 9), torch.randn(2, 8)), {})  # static axis differs
    assert not spec.accepts((torch.randn(2, 8, 1), torch.randn(2, 8)), {})  # rank
    assert not spec.accepts((torch.randn(2, 8), torch.randn(2, 8, dtype=torch.float64)), {})  # dtype
    assert not spec.accepts((torch.randn(2, 8), [torch.randn(2, 8)]), {})  # a container is not a tensor leaf
    assert not spec.accepts((torch.randn(2, 8), torch.randn(2, 8), 2.0), {})  # different set of arguments
    assert spec.accepts((torch.randn(2, 8),), {"y": torch.randn(2, 8)})  # keyword form takes the full check


def test_keyword_fast_path_keeps_every_check():
    """`model(input_ids=..., attention_mask=...)`: after one accepted call, later ones skip binding, not checks."""

    def forward(input_ids, attention_mask=None, token_type_ids=None, output_attentions=False):
        return input_ids

    recorder = GraphRecorder(forward)
    for batch in (1, 4):
        ids = torch.randint(0, 9, (batch, 16))
        recorder.record((), {"input_ids": ids, "attention_mask": torch.ones(batch, 16)}, None, batch_size=batch)
    (spec,) = recorder.graph_specs

    def call(ids, mask):
        return spec.accepts((), {"input_ids": ids, "attention_mask": mask})

    assert call(torch.randint(0, 9, (2, 16)), torch.ones(2, 16))
    assert spec._fast_layouts == {(0, ("input_ids", "attention_mask")): ("input_ids", "attention_mask")}
    assert call(torch.randint(0, 9, (3, 16)), torch.ones(3, 16))
    assert not call(torch.randint(0, 9, (5, 16)), torch.ones(5, 16))  # batch above max
    assert not call(torch.randint(0, 9, (2, 16)), torch.ones(2, 17))  # static axis of the second tensor
    assert not call(torch.ones(2, 16), torch.ones(2, 16))  # dtype of the first
    assert not call(torch.randint(0, 9, (2, 16)), None)  # not a tensor: full check, different graph
    # the same tensors in the other keyword order are a layout of their own, checked in full the first time
    mask, ids = torch.ones(2, 16), torch.randint(0, 9, (2, 16))
    assert spec.accepts((), {"attention_mask": mask, "input_ids": ids})
    assert spec._fast_layouts[(0, ("attention_mask", "input_ids"))] == ("input_ids", "attention_mask")
    assert not spec.accepts((), {"attention_mask": ids, "input_ids": mask})  # swapped values: dtypes differ
    # a non-tensor passed explicitly is a different (strict) graph even with tensor-only layouts learned
    assert not spec.accepts((), {"input_ids": ids, "attention_mask": mask, "output_attentions": True})


def test_fast_path_not_learned_for_a_tensor_passed_twice():
    def forward(x, y):
        return x + y

    recorder = GraphRecorder(forward)
    recorder.record((torch.randn(2, 8), torch.randn(2, 8)), {}, None, batch_size=2)
    (spec,) = recorder.graph_specs
    x = torch.randn(2, 8)
    assert spec.accepts((x, x), {})
    assert spec._fast_layouts == {}
