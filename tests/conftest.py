"""Suite-wide settings: keep Inductor's caches on and in one place so repeated compiles are cheap, and leave the
`heavy` tests to `make test-all` (`AITUNE_TEST_HEAVY=1`): CI runs the suite on 2 cores within 15 minutes."""

import os
import tempfile
from pathlib import Path

import pytest

_CACHE = Path(os.environ.get("AITUNE_TEST_CACHE", Path(tempfile.gettempdir()) / "aitune-test-inductor-cache"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(_CACHE))
os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A `heavy` test repeats a class of real workload that another test of the default run covers (LLaMA's
    `generate()` beside GPT-2's, T5 beside BART): skipped, with the reason shown, unless AITUNE_TEST_HEAVY=1."""
    if os.environ.get("AITUNE_TEST_HEAVY", "").strip() in ("1", "true", "yes", "on"):
        return
    skip = pytest.mark.skip(reason="heavy: its class of workload is covered by the default run; "
                                   "AITUNE_TEST_HEAVY=1 (make test-all) runs it")
    for item in items:
        if "heavy" in item.keywords:
            item.add_marker(skip)
