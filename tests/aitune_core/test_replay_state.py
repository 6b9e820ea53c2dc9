"""`replaying(spec)`: a graph's replays run under the autocast state and default device it was called with."""

from __future__ import annotations

import torch

from aitune_core.recording.graph_recorder import GraphRecorder
from aitune_core.specs.autocast_state import current_autocast
from aitune_core.specs.default_device import current_default_device
from aitune_core.specs.replay_state import describe_replay_state, replaying


def _spec():
    net = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    recorder = GraphRecorder(net)
    with torch.no_grad(), torch.device("meta"), torch.autocast("cpu", dtype=torch.bfloat16):
        return recorder.record((x,), {}, net(x))


def test_replaying_enters_the_recorded_state_and_leaves_it():
    spec = _spec()
    assert describe_replay_state(spec) == "autocast cpu bfloat16, default device meta"
    with replaying(spec):
        assert current_autocast() == (("cpu", "bfloat16"),) and current_default_device() == "meta"
    assert current_autocast() == () and current_default_device() is None
    with replaying(None):
        assert current_autocast() == ()
