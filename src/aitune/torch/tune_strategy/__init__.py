"""Tuning strategies."""

from aitune_core.strategies.first_wins import FirstWinsStrategy
from aitune_core.strategies.highest_throughput import HighestThroughputStrategy
from aitune_core.strategies.one_backend import OneBackendStrategy
from aitune_core.strategies.strategy import TuneStrategy

__all__ = ["FirstWinsStrategy", "HighestThroughputStrategy", "OneBackendStrategy", "TuneStrategy"]
