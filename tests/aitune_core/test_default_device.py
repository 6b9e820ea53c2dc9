"""The calling thread's default device: read, entered, stored, and part of a graph's identity."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from aitune_core.recording.graph_recorder import GraphRecorder
from aitune_core.specs.default_device import current_default_device, default_device_as, default_device_from_json
from aitune_core.specs.graph_spec import GraphSpec


def test_the_default_device_is_read_per_thread():
    assert current_default_device() is None
    seen = []
    with torch.device("meta"):
        assert current_default_device() == "meta"
        other = threading.Thread(target=lambda: seen.append(current_default_device()))
        other.start()
        other.join()
    assert seen == [None]  # why the worker's replays must enter it again


def test_default_device_as_sets_the_device_for_the_body_only():
    with default_device_as("meta"):
        assert torch.zeros(1).device.type == "meta"
        with default_device_as(None):
            assert torch.zeros(1).device.type == "cpu"
    assert torch.zeros(1).device.type == "cpu"


def test_a_stored_default_device_is_checked():
    assert default_device_from_json(None) is None
    assert default_device_from_json("cuda:0") == "cuda:0"
    for hostile in (3, "gpu", "cuda:x", "__import__('os')"):
        with pytest.raises(ValueError, match="default device"):
            default_device_from_json(hostile)


def test_calls_under_another_default_device_are_another_graph():
    net = torch.nn.Linear(4, 4)
    recorder = GraphRecorder(net)
    x = torch.randn(2, 4)
    with torch.no_grad():
        plain = recorder.record((x,), {}, net(x))
        with torch.device("meta"):
            other = recorder.record((x,), {}, net(x))  # the forward makes no tensors of its own
    assert (plain.name, other.name, other.default_device) == ("0", "1", "meta")
    assert plain.accepts((x,), {}) and not other.accepts((x,), {})
    assert "called with default device cpu, graph recorded with meta" in other.mismatch((x,), {})
    with torch.device("meta"):
        assert other.accepts((x,), {}) and not plain.accepts((x,), {})
    assert "default_device" not in plain.to_dict()
    assert GraphSpec.from_dict(json.loads(json.dumps(other.to_dict()))) == other
