"""Public API of aitune for PyTorch: re-exports only (implementation lives in aitune_core/_aot/_jit)."""

from aitune_aot.checkpoint_io import load, save
from aitune_aot.module import Module
from aitune_aot.samples import samples_generator
from aitune_aot.tune import tune
from aitune_core.config import config
from aitune_core.context import BATCH_SIZE_KEY, global_context
from aitune_core.recording.sample import Sample
from aitune_core.specs.graph_spec import GraphSpec
from aitune_core.specs.sample_metadata import SampleMetadata
from aitune_core.specs.tensor_spec import TensorSpec
from aitune_core.strategies.first_wins import FirstWinsStrategy
from aitune_core.strategies.highest_throughput import HighestThroughputStrategy
from aitune_core.strategies.one_backend import OneBackendStrategy
from aitune_core.strategies.strategy import TuneStrategy
from aitune_jit.config import jit_config
from aitune_jit.decorator import patch_for_jit_tuning, prepare_for_jit_tuning
from aitune_jit.patched_module import PatchedModule

from . import backend, tune_strategy

__all__ = [
    "BATCH_SIZE_KEY",
    "FirstWinsStrategy",
    "GraphSpec",
    "HighestThroughputStrategy",
    "Module",
    "OneBackendStrategy",
    "PatchedModule",
    "Sample",
    "SampleMetadata",
    "TensorSpec",
    "TuneStrategy",
    "backend",
    "config",
    "global_context",
    "jit_config",
    "load",
    "patch_for_jit_tuning",
    "prepare_for_jit_tuning",
    "samples_generator",
    "save",
    "tune",
    "tune_strategy",
]
