"""PatchedModule: what a recording or tuned module's forward does for calls that are not the program's own."""

from __future__ import annotations

import warnings

import torch
from jit_helpers import CountingBackend, make_mlp, run

from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.state import NodeState
from aitune_jit.switch import enable


def test_torch_jit_trace_of_a_tuned_module_records_the_original_forward() -> None:
    # the tuned call's shape check ran on traced sizes: a TracerWarning (a SystemError under "error"), and the
    # backend was dropped for good as failed at run time
    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False
    jit_config.min_parameters = 0
    jit_config.min_samples = 2
    model = make_mlp()
    enable()
    run(model, [1, 2, 1, 2])
    node = PatchedModule.of(model)
    assert node.state is NodeState.TUNED
    infers = CountingBackend.infers
    x = torch.randn(2, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.jit.TracerWarning)
        traced = torch.jit.trace(model, (x,), check_trace=False)  # (its check calls the model again, untraced)
    assert CountingBackend.infers == infers  # the trace ran the original forward, not the backend
    with torch.no_grad():
        torch.testing.assert_close(traced(x), model(x))
    assert node.state is NodeState.TUNED and CountingBackend.infers > infers  # still tuned, still served
