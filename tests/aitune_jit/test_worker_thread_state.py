"""Background tuning replays a graph under the thread state the program called it in (autocast, default device).

Both are per thread, and the worker's thread has neither: `aitune_core/specs/replay_state.py`.
"""

from __future__ import annotations

import torch
from jit_helpers import CountingBackend, make_mlp

from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.state import NodeState
from aitune_jit.switch import enable
from aitune_jit.worker import wait_until_tuned


def _autocast_run(model: torch.nn.Module, batches: list[int], cast: list[bool]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    outputs = []
    with torch.no_grad():
        for batch, on in zip(batches, cast):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=on):
                outputs.append(model(torch.randn(batch, 32, generator=generator)))
    return outputs


def test_a_module_called_under_autocast_is_tuned_on_the_worker_under_that_autocast(background):
    """Autocast is thread-local: the worker replays, builds and validates a graph under the state it was
    recorded under (before, every candidate failed on the output dtype, and the module stayed eager)."""
    model = make_mlp()
    enable()
    _autocast_run(model, [2, 3, 4], [True] * 3)
    assert wait_until_tuned(timeout=30)
    node = PatchedModule.of(model)
    assert node.state is NodeState.TUNED, node.reason
    infers = _served_by(node)
    outputs = _autocast_run(model, [2, 4, 3], [True, True, False])
    reference = _autocast_run(make_mlp(), [2, 4, 3], [True, True, False])
    assert [o.dtype for o in outputs] == [torch.bfloat16, torch.bfloat16, torch.float32]
    torch.testing.assert_close(outputs, reference, rtol=0, atol=0)
    assert _served_by(node) == infers + 2  # the plain call is another graph: the original forward


def _served_by(node: PatchedModule) -> int:
    """Calls served by this node's own backends (a child node tuned under load counts in the class-wide count,
    which once made this test see one call more)."""
    return sum(getattr(backend, "own_infers", 0) for backend in node.backends)


def test_calls_with_and_without_autocast_are_tuned_as_two_graphs(background, caplog):
    model = make_mlp()
    enable()
    pattern = [True, False] * 3
    _autocast_run(model, [2, 3, 4, 5, 6, 7], pattern)
    assert wait_until_tuned(timeout=30)
    node = PatchedModule.of(model)
    assert node.state is NodeState.TUNED, node.reason
    assert [spec.autocast for spec in node.recorder.graph_specs] == [(("cpu", "bfloat16"),), ()]
    assert "output structure changed" not in caplog.text
    infers = CountingBackend.infers
    torch.testing.assert_close(_autocast_run(model, [3, 4], [True, False]),
                               _autocast_run(make_mlp(), [3, 4], [True, False]), rtol=0, atol=0)
    assert CountingBackend.infers == infers + 2


#: call number -> default device; a dict, since a global dict that only grows is not taken for a forward's effect
#: on the program (`aitune_core/recording/outside_effects.py`), where a list would keep the witness from replays
_DEVICES_SEEN: dict[int, str] = {}


class _DeviceWitness(torch.nn.Module):
    """Notes the default device of every call of its forward (the program's and every replay of tuning)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(32, 32)

    def forward(self, x):
        _DEVICES_SEEN[len(_DEVICES_SEEN)] = torch.get_default_device().type
        return self.lin(x) * 2


def test_a_graph_called_under_a_default_device_is_replayed_under_it_on_the_worker(background):
    from aitune_core.strategies.highest_throughput import HighestThroughputStrategy

    # a measuring strategy: its eager timing before any build, the candidate's timing: every replay of tuning
    jit_config.strategy = HighestThroughputStrategy([CountingBackend()], min_eager_latency_us=0.001, min_speedup=0.0,
                                                    warmup=1, iterations=2)
    _DEVICES_SEEN.clear()
    model = _DeviceWitness().eval()
    enable()
    inputs = [torch.randn(batch, 32) for batch in (2, 3, 4)]
    with torch.no_grad(), torch.device("meta"):  # the forward makes no tensors of its own: it runs as before
        for x in inputs:
            model(x)
    node = PatchedModule.of(model)
    specs = node.recorder.graph_specs if node.recorder is not None else []
    assert wait_until_tuned(timeout=30)
    assert node.state is NodeState.TUNED or "faster than eager" in node.reason, node.reason  # (a slower backend)
    assert [spec.default_device for spec in specs] in ([], ["meta"])
    assert len(_DEVICES_SEEN) > len(inputs) and set(_DEVICES_SEEN.values()) == {"meta"}  # the replays too
