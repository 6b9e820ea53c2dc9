"""Shared fakes for the backend / strategy / validation tests: tiny models, recorded graphs, fake backends."""

from __future__ import annotations

import dataclasses
import time

import torch

from aitune_core.backends.backend import Backend, BackendConfig
from aitune_core.context import BATCH_SIZE_KEY, global_context
from aitune_core.recording.graph_recorder import GraphRecorder


class TinyMLP(torch.nn.Module):
    def __init__(self, features: int = 8, hidden: int = 16, out: int = 4) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(features, hidden)
        self.act = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(hidden, out)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def record(module, batch_sizes=(2, 4), features: int = 8, seed: int = 0):
    """Record `module` on random inputs of the given batch sizes; returns (graph_spec, samples)."""
    torch.manual_seed(seed)
    recorder = GraphRecorder(module)
    with torch.no_grad():
        for batch in batch_sizes:
            x = torch.randn(batch, features)
            with global_context:
                global_context.set(BATCH_SIZE_KEY, batch)
                recorder.record((x,), {}, module(x), batch_size=batch)
    assert len(recorder.graph_specs) == 1
    spec = recorder.graph_specs[0]
    return spec, recorder.samples(spec)


@dataclasses.dataclass(frozen=True)
class FakeConfig(BackendConfig):
    delay_s: float = 0.0
    tag: str = ""


class _ModuleBackend(Backend):
    config_class = FakeConfig

    def __init__(self, config: FakeConfig | None = None) -> None:
        super().__init__(config)
        self.module = None
        self.build_calls = 0

    def _build(self, module, graph_spec, data, cache_dir):
        self.build_calls += 1
        self.module = module

    def _infer(self, *args, **kwargs):
        if self.config.delay_s:
            time.sleep(self.config.delay_s)
        return self.module(*args, **kwargs)

    def _load_extra_state(self, module, state_dict):
        self.module = module


class GoodBackend(_ModuleBackend):
    """Runs the module (optionally sleeping `delay_s` per call)."""


class SlowBackend(_ModuleBackend):
    """Like GoodBackend, with a default delay: deliberately slower."""

    def __init__(self, config: FakeConfig | None = None) -> None:
        super().__init__(config or FakeConfig(delay_s=0.01))


class BuildFailsBackend(_ModuleBackend):
    def _build(self, module, graph_spec, data, cache_dir):
        raise RuntimeError("compiler exploded")


class WrongValuesBackend(_ModuleBackend):
    def _infer(self, *args, **kwargs):
        return self.module(*args, **kwargs) + 1.0


class NaNBackend(_ModuleBackend):
    def _infer(self, *args, **kwargs):
        out = self.module(*args, **kwargs).clone()
        out[0, 0] = float("nan")
        return out
