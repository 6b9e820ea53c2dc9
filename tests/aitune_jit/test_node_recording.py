"""NodeRecording: what a node records, and that a failure while recording never reaches the call."""

from __future__ import annotations

import logging

import torch
from jit_helpers import CountingBackend, make_mlp

from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.state import NodeState
from aitune_jit.switch import enable


def _setup() -> None:
    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False


def test_training_mode_and_gradient_calls_are_not_recorded():
    _setup()
    model = make_mlp()
    enable()
    x = torch.randn(2, 32)
    model.train()
    with torch.no_grad():
        model(x)
    model.eval()
    model(x)  # gradients enabled and trainable parameters: not an inference call
    node = PatchedModule.of(model)
    assert node.state is NodeState.RECORDING and node.recorder.total_calls == 0
    assert any("training mode" in line for line in PatchedModule.history)
    assert any("gradients enabled" in line for line in PatchedModule.history)


def test_a_failure_while_recording_ends_tuning_not_the_call(caplog):
    _setup()
    model = make_mlp()
    enable()
    x = torch.randn(2, 32)
    with torch.no_grad():
        model(x)  # the node exists and records from now on
        node = PatchedModule.of(model)

        def broken(*args, **kwargs):
            raise KeyError("recorder bug")

        node.recorder.record = broken
        with caplog.at_level(logging.INFO, logger="aitune"):
            out = model(x)
    torch.testing.assert_close(out, type(model).forward(model, x))
    assert node.state is NodeState.EAGER and "cannot be recorded (KeyError" in node.reason
