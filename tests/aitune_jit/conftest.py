"""Fixtures of the JIT tests: every test leaves the hook off, the config at its defaults and the history empty."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # jit_helpers

from jit_helpers import CountingBackend

from aitune_jit import decisions, summary
from aitune_jit.config import jit_config
from aitune_jit.node_registry import registry
from aitune_jit.patched_module import PatchedModule
from aitune_jit.switch import disable
from aitune_jit.worker import wait_until_tuned

ORIGINAL_CALL = torch.nn.Module.__call__


def _test_config(tmp_path: Path) -> None:
    """Most JIT tests check what tuning did right after the call that triggered it: they tune synchronously
    (tests of the background worker switch `blocking` off), and decisions stay within the test."""
    jit_config.reset(read_env=False)
    jit_config.blocking = True
    jit_config.cache_dir = tmp_path / "aitune-jit-cache"
    decisions.reset()


@pytest.fixture(autouse=True)
def jit_clean_state(tmp_path):
    _test_config(tmp_path)
    CountingBackend.reset_counts()
    yield
    disable()
    wait_until_tuned(timeout=60)
    _test_config(tmp_path)
    PatchedModule.clear_history()
    registry.nodes_seen = 0
    summary.reset()
    assert torch.nn.Module.__call__ is ORIGINAL_CALL, "a test leaked the JIT patch"
    # (dynamo wraps Module.__init__ for good the first time it compiles; only aitune's scope wrapper must be gone)
    assert not getattr(torch.nn.Module.__init__, "__aitune_jit_scope__", False), "a test leaked a decorator scope"


@pytest.fixture
def background():
    """Background tuning (the worker), with the counting backend and no graph-break probe."""
    jit_config.blocking = False
    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False
    jit_config.min_parameters = 0
    yield
    wait_until_tuned(timeout=30)
