"""A candidate backend that fails before or while building is a normal candidate failure in JIT tuning.

Through the public API, on the CPU: a custom backend that cannot be deep-copied (it holds a lock) and one whose
`_build` raises after side effects. The script's outputs are exactly the eager ones and the node is EAGER with
the reason in the history.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from jit_helpers import make_mlp, run

import aitune.torch as ait
from aitune.torch.jit import enable
from aitune_core.backends.backend import Backend


class LockHoldingBackend(Backend):
    """Holds a lock: `copy.deepcopy` (the per-candidate blueprint copy) raises TypeError."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

    def _build(self, module: torch.nn.Module, graph_spec: Any, data: list, cache_dir: Path) -> None:
        self._module = module

    def _infer(self, *args: Any, **kwargs: Any) -> Any:
        return self._module(*args, **kwargs)


class SideEffectsThenRaiseBackend(Backend):
    """Writes into its cache folder, keeps the module, then raises in `_build`."""

    built: ClassVar[list[str]] = []

    def _build(self, module: torch.nn.Module, graph_spec: Any, data: list, cache_dir: Path) -> None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        (cache_dir / "half-written.bin").write_bytes(b"\0" * 16)
        self._module = module
        SideEffectsThenRaiseBackend.built.append(graph_spec.name)
        raise KeyError("lost state after side effects")

    def _infer(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover - never built
        raise AssertionError("never built")


@pytest.mark.parametrize(
    ("backend", "cause"),
    [
        (LockHoldingBackend(), "TypeError"),
        (SideEffectsThenRaiseBackend(), "lost state after side effects"),
    ],
)
def test_failing_candidate_leaves_outputs_unchanged_and_node_eager(tmp_path, backend, cause):
    ait.jit_config.backends = [backend]
    ait.jit_config.detect_graph_breaks = False
    ait.jit_config.max_depth_level = 0  # only the root: one failure, one history line
    ait.jit_config.cache_dir = tmp_path
    batches = [2, 3, 4, 5]
    model = make_mlp()
    reference = run(make_mlp(), batches)
    enable()
    outputs = run(model, batches)
    for out, ref in zip(outputs, reference, strict=True):
        torch.testing.assert_close(out, ref, rtol=0, atol=0)
    root = ait.PatchedModule.of(model)
    assert root.state.value == "eager" and cause in root.reason
    failures = [line for line in ait.PatchedModule.history if "failed" in line and cause in line]
    assert failures, ait.PatchedModule.history
