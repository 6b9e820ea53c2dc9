"""Models and fake backends shared by the JIT tests (small, CPU, no Inductor unless a test is about it)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import torch

from aitune_core.backends.backend import Backend


class CountingBackend(Backend):
    """Runs the module it was built for; counts builds and inferences (class-wide, shared by copies)."""

    builds = 0
    infers = 0
    build_delay_s = 0.0
    _lock = threading.Lock()

    @classmethod
    def reset_counts(cls) -> None:
        cls.builds = 0
        cls.infers = 0
        cls.build_delay_s = 0.0

    def _build(self, module: torch.nn.Module, graph_spec: Any, data: list, cache_dir: Path) -> None:
        with CountingBackend._lock:
            CountingBackend.builds += 1
        if CountingBackend.build_delay_s:
            time.sleep(CountingBackend.build_delay_s)
        self._module = module

    def _infer(self, *args: Any, **kwargs: Any) -> Any:
        with CountingBackend._lock:
            CountingBackend.infers += 1
            self.own_infers = getattr(self, "own_infers", 0) + 1  # (this instance's: one node's backend)
        return self._module(*args, **kwargs)


class RaisingBackend(Backend):
    """Fails every build."""

    def _build(self, module: torch.nn.Module, graph_spec: Any, data: list, cache_dir: Path) -> None:
        raise RuntimeError("RaisingBackend refuses to build")

    def _infer(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - never built
        raise AssertionError("never built")


class WrongValuesBackend(Backend):
    """Builds fine but returns wrong values (output + 1): validation must reject it."""

    def _build(self, module: torch.nn.Module, graph_spec: Any, data: list, cache_dir: Path) -> None:
        self._module = module

    def _infer(self, *args: Any, **kwargs: Any) -> Any:
        return self._module(*args, **kwargs) + 1.0


class FailsAtRunTimeBackend(CountingBackend):
    """Builds and validates, then raises on every later call (after `fail_after` inferences)."""

    fail_after = 10**9

    def _infer(self, *args: Any, **kwargs: Any) -> Any:
        if CountingBackend.infers >= FailsAtRunTimeBackend.fail_after:
            raise RuntimeError("backend broke at run time")
        return super()._infer(*args, **kwargs)


class WholeGraphBackend(CountingBackend):
    """Traces the module with dynamo as one graph at build time (`fullgraph=True`, no code generation): a graph
    break fails the build, so the tuner needs no separate graph-break check (`traces_whole_graph`)."""

    @property
    def traces_whole_graph(self) -> bool:
        return True

    def _build(self, module: torch.nn.Module, graph_spec: Any, data: list, cache_dir: Path) -> None:
        from aitune_core.backends.isolated_entry import isolated_entry

        super()._build(module, graph_spec, data, cache_dir)
        traced = torch.compile(isolated_entry(module, "whole_graph_test"), backend="eager", fullgraph=True)
        with torch.no_grad():
            traced(*data[0].args, **data[0].kwargs)


class WholeGraphWrongValuesBackend(WholeGraphBackend):
    """Traces as one graph, then returns wrong values: validation rejects it after a build."""

    def _infer(self, *args: Any, **kwargs: Any) -> Any:
        return super()._infer(*args, **kwargs) + 1.0


class Block(torch.nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width)
        self.act = torch.nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.norm(self.fc(x)))


class MLP(torch.nn.Module):
    """root -> Sequential(Block, Block) -> (Linear, LayerNorm, ReLU); head Linear."""

    def __init__(self, width: int = 32, blocks: int = 2) -> None:
        super().__init__()
        self.blocks = torch.nn.Sequential(*[Block(width) for _ in range(blocks)])
        self.head = torch.nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


class DynamicModule(torch.nn.Module):
    """A typical graph break: control flow on the input's values."""

    def __init__(self) -> None:
        super().__init__()
        self.child_a = torch.nn.Linear(10, 20)
        self.child_b = torch.nn.Linear(10, 20)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # graph break: conditional on input
            return self.child_a(x)
        else:
            return self.child_b(x)


def enable_and_serve_both_branches(model: DynamicModule, rounds: int = 4) -> None:
    """Switch JIT tuning on, call `model` with inputs that take each branch, `rounds` times, and check every output
    against the branch's child, run eagerly before the switch (a child called alone with the JIT on would become
    a root of its own)."""
    from aitune_jit.switch import enable

    positive, negative = torch.ones(2, 10), -torch.ones(2, 10)
    with torch.no_grad():
        expected = [model.child_a(positive), model.child_b(negative)]
    enable()
    with torch.no_grad():
        for _ in range(rounds):
            outputs = [model(positive), model(negative)]
            for out, ref in zip(outputs, expected):
                torch.testing.assert_close(out, ref)


def make_mlp(seed: int = 0, **kwargs: Any) -> MLP:
    torch.manual_seed(seed)
    return MLP(**kwargs).eval()


def run(model: torch.nn.Module, batch_sizes: list[int], width: int = 32, seed: int = 1) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    outputs = []
    with torch.no_grad():
        for batch in batch_sizes:
            outputs.append(model(torch.randn(batch, width, generator=generator)))
    return outputs


def enable_and_run_mlp(batch_sizes: list[int]) -> MLP:
    """Switch JIT tuning on, run a fresh `make_mlp()` at `batch_sizes` and check its outputs against an identical
    MLP run before the switch; returns the model (its node tells what tuning did)."""
    from aitune_jit.switch import enable

    model = make_mlp()
    reference = run(make_mlp(), batch_sizes)
    enable()
    for out, ref in zip(run(model, batch_sizes), reference):
        torch.testing.assert_close(out, ref)
    return model


def states(model: torch.nn.Module) -> dict[str, str]:
    """path -> state value of every node under (and including) `model`'s node."""
    from aitune_jit.patched_module import PatchedModule

    node = PatchedModule.of(model)
    assert node is not None, "the model is not a node"
    return {n.path: n.state.value for n in node.subtree()}


def run_exit_hook() -> None:
    """The worker's exit hook, as `threading` runs it when the main thread's code ends, with no worker of its own
    (only the live jobs are cancelled); the flags it sets are put back, since this process goes on."""
    from aitune_jit import worker, worker_yield

    saved = worker._worker
    worker._worker = None
    try:
        worker._at_exit()
    finally:
        worker._worker = saved
        worker._exiting = False
        worker_yield._stood_down = False


def recording_mlp(min_samples: int = 5) -> tuple[MLP, Any]:
    """Switch JIT tuning on with a `CountingBackend` and call a fresh `make_mlp()` twice: its root records (needs
    `min_samples` calls) and its children are seen but wait. Returns the model and its node."""
    from aitune_jit.config import jit_config
    from aitune_jit.patched_module import PatchedModule
    from aitune_jit.state import NodeState
    from aitune_jit.switch import enable

    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False
    jit_config.min_parameters = 0
    jit_config.min_samples = min_samples
    model = make_mlp()
    enable()
    run(model, [2, 3])
    node = PatchedModule.of(model)
    assert node.state is NodeState.RECORDING and "forward" in model.__dict__
    return model, node
