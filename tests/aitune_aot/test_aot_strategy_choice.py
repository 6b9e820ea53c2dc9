"""strategy_choice: one strategy per recorded graph, and the checks on what the user passed."""

from __future__ import annotations

import pytest

from aitune_aot.strategy_choice import strategies_for, validate_strategies
from aitune_core.backends.torch_eager import TorchEagerBackend
from aitune_core.strategies.first_wins import FirstWinsStrategy


class _Spec:
    def __init__(self, name: str) -> None:
        self.name = name


def test_per_graph_strategies_by_name_list_and_default():
    a, b, default = (FirstWinsStrategy([TorchEagerBackend()]) for _ in range(3))
    specs = [_Spec("0"), _Spec("1")]
    assert strategies_for("m", specs, {"1": b}, a, lambda: default) == [a, b]
    assert strategies_for("m", specs, None, None, lambda: default) == [default, default]
    assert strategies_for("m", specs, [b, a, a], None, lambda: default) == [b, a]
    with pytest.raises(ValueError, match="recorded 2 graphs but 1 strategies"):
        strategies_for("m", specs, [a], None, lambda: default)


def test_wrong_types_are_refused():
    with pytest.raises(TypeError, match="strategy must be a TuneStrategy"):
        validate_strategies("fast", None)
    with pytest.raises(TypeError, match="graph names"):
        validate_strategies(None, {0: FirstWinsStrategy([TorchEagerBackend()])})
