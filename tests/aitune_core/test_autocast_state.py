"""The thread's autocast state: read, entered exactly, stored, and part of a graph's identity."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from aitune_core.recording.graph_recorder import GraphRecorder
from aitune_core.specs.autocast_state import (
    autocast_as,
    autocast_from_json,
    autocast_to_json,
    current_autocast,
    describe_autocast,
)
from aitune_core.specs.graph_spec import GraphSpec

BF16 = (("cpu", "bfloat16"),)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x)


def _record(recorder: GraphRecorder, net: Net, x: torch.Tensor) -> GraphSpec:
    with torch.no_grad():
        return recorder.record((x,), {}, net(x))


def test_current_autocast_reads_the_calling_thread_only():
    assert current_autocast() == ()
    seen = []
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert current_autocast() == BF16
        other = threading.Thread(target=lambda: seen.append(current_autocast()))
        other.start()
        other.join()
        with torch.autocast("cpu", enabled=False):
            assert current_autocast() == ()
    assert seen == [()]  # autocast is thread-local: why replays on the worker must enter it again


def test_autocast_as_sets_exactly_the_given_state_and_restores_the_old_one():
    with autocast_as(BF16):
        assert current_autocast() == BF16
        assert torch.nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.bfloat16
    assert current_autocast() == ()
    with torch.autocast("cpu", dtype=torch.float16):
        with autocast_as(BF16):
            assert current_autocast() == BF16
        with autocast_as(()):
            assert current_autocast() == ()
            assert torch.nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.float32
        assert current_autocast() == (("cpu", "float16"),)


def test_the_state_round_trips_through_json_and_a_foreign_one_is_refused():
    assert autocast_from_json(json.loads(json.dumps(autocast_to_json(BF16)))) == BF16
    assert autocast_from_json(None) == ()
    assert describe_autocast(()) == "no autocast"
    assert describe_autocast(BF16) == "autocast cpu bfloat16"
    for hostile in ("cpu", [["cpu"]], [["gpu", "bfloat16"]], [["cpu", "int8"]], [["cpu", "__import__('os')"]],
                    [["cpu", "bfloat16"], ["cpu", "float16"]]):
        with pytest.raises(ValueError, match="autocast state"):
            autocast_from_json(hostile)


def test_calls_with_and_without_autocast_are_two_graphs_each_accepting_only_its_own():
    net = Net().eval()
    recorder = GraphRecorder(net)
    plain = _record(recorder, net, torch.randn(2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = _record(recorder, net, torch.randn(2, 8))
        assert recorder.recorded_at_least((torch.randn(2, 8),), {}, 1)
    assert (plain.name, cast.name) == ("0", "1")
    assert (plain.autocast, cast.autocast) == ((), BF16)
    assert cast.output_spec.tensors[0].dtype == torch.bfloat16
    x = torch.randn(2, 8)
    assert plain.accepts((x,), {}) and not cast.accepts((x,), {})
    assert "called under no autocast, graph recorded under autocast cpu bfloat16" in cast.mismatch((x,), {})
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert cast.accepts((x,), {}) and not plain.accepts((x,), {})
        assert recorder.match((x,), {}) is recorder.graph_spec("1")
    assert plain.identity() != cast.identity()


def test_a_graph_spec_keeps_its_autocast_through_to_dict_and_plain_specs_keep_their_old_form():
    net = Net().eval()
    recorder = GraphRecorder(net)
    plain = _record(recorder, net, torch.randn(2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = _record(recorder, net, torch.randn(2, 8))
    assert "autocast" not in plain.to_dict()
    assert GraphSpec.from_dict(json.loads(json.dumps(cast.to_dict()))) == cast
    edited = cast.to_dict()
    edited["autocast"] = [["cpu", "no-such-dtype"]]
    with pytest.raises(ValueError, match="autocast state"):
        GraphSpec.from_dict(edited)


def test_a_graph_called_under_autocast_is_validated_with_the_autocast_dtype_s_tolerance():
    from aitune_core.specs.autocast_state import autocast_dtypes
    from aitune_core.validation.tolerance import Tolerance, default_tolerance, under_autocast

    fp32 = default_tolerance(torch.float32)
    widened = under_autocast(default_tolerance, autocast_dtypes(BF16))
    assert widened(torch.float32) == fp32.widen(default_tolerance(torch.bfloat16)) != fp32
    assert widened(torch.int64) == Tolerance(0.0, 0.0)
    assert under_autocast(default_tolerance, []) is default_tolerance
