"""AOT tests: an empty module registry and a private cache folder per test."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # aot_models

from aitune_aot.registry import MODULE_REGISTRY
from aitune_core.config import config


@pytest.fixture(autouse=True)
def _isolated_aot(tmp_path):
    MODULE_REGISTRY.clear()
    with config.override(cache_dir=tmp_path / "cache"):
        yield
    MODULE_REGISTRY.clear()
