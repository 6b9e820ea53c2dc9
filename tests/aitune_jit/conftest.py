"""Fixtures of the JIT tests: every test leaves the hook off, the config at its defaults and the history empty."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # jit_helpers

from jit_helpers import CountingBackend

from aitune_jit import summary
from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.switch import disable

ORIGINAL_CALL = torch.nn.Module.__call__


@pytest.fixture(autouse=True)
def jit_clean_state():
    jit_config.reset(read_env=False)
    CountingBackend.reset_counts()
    yield
    disable()
    jit_config.reset(read_env=False)
    PatchedModule.clear_history()
    PatchedModule.nodes_seen = 0
    summary.reset()
    assert torch.nn.Module.__call__ is ORIGINAL_CALL, "a test leaked the JIT patch"
    # (dynamo wraps Module.__init__ for good the first time it compiles; only aitune's scope wrapper must be gone)
    assert not getattr(torch.nn.Module.__init__, "__aitune_jit_scope__", False), "a test leaked a decorator scope"
