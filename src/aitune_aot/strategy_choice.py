"""Which strategy tunes which recorded graph of an AOT `Module`, and the checks on what the user passed.

Why apart from the wrapper: the rules (a list in graph order or a dict keyed by graph name, a module-level
strategy, the one given to `tune()`, the default) are plain logic that `Module` and `aitune.torch.tune` share.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aitune_core.specs.graph_spec import GraphSpec
    from aitune_core.strategies.strategy import TuneStrategy

_logger = logging.getLogger("aitune.aot.module")


def _first_wins_default_backends() -> TuneStrategy:
    from aitune_core.strategies.defaults import default_strategy as core_default_strategy

    return core_default_strategy(measure=False)


#: Factory of the strategy used when neither the module nor `tune()` names one. Replace it to change the
#: default for the whole process (e.g. `aitune_aot.strategy_choice.default_strategy_factory = lambda: ...`).
default_strategy_factory: Callable[[], TuneStrategy] = _first_wins_default_backends


def default_strategy() -> TuneStrategy:
    """A fresh default strategy unless the factory was replaced: `aitune_core.strategies.defaults.default_strategy(
    measure=False)`, i.e. FirstWinsStrategy over `default_backends()` (Inductor; TensorRT first when importable)."""
    return default_strategy_factory()


def validate_strategies(strategy: Any, strategies: Any) -> None:
    """The strategy and per-graph strategies (a list, or a dict keyed by graph name) have the right types."""
    if strategy is None and strategies is None:
        return
    from aitune_core.strategies.strategy import TuneStrategy

    if strategy is not None and not isinstance(strategy, TuneStrategy):
        raise TypeError(f"strategy must be a TuneStrategy, got {type(strategy).__name__}")
    if strategies is None:
        return
    if isinstance(strategies, Mapping):
        values = list(strategies.values())
        if not all(isinstance(k, str) for k in strategies):
            raise TypeError("strategies dict must map graph names (str, e.g. '0') to strategies")
    elif isinstance(strategies, Sequence) and not isinstance(strategies, str):
        values = list(strategies)
    else:
        raise TypeError(f"strategies must be a list or a dict of TuneStrategy, got {type(strategies).__name__}")
    for value in values:
        if not isinstance(value, TuneStrategy):
            raise TypeError(f"strategies must hold TuneStrategy instances, got {type(value).__name__}")


def strategies_for(
    name: str,
    graph_specs: Sequence[GraphSpec],
    strategies: Sequence[TuneStrategy] | Mapping[str, TuneStrategy] | None,
    fallback: TuneStrategy | None,
    default: Callable[[], TuneStrategy],
) -> list[TuneStrategy]:
    """One strategy per recorded graph: the per-graph ones given to the module, else `fallback`, else `default()`."""
    if strategies is None:
        chosen = fallback or default()
        return [chosen] * len(graph_specs)
    if isinstance(strategies, Mapping):
        unknown = sorted(set(strategies) - {spec.name for spec in graph_specs})
        if unknown:
            _logger.warning(
                "Module `%s`: strategies given for graphs %s that were not recorded", name, unknown
            )
        out = []
        for spec in graph_specs:
            chosen = strategies.get(spec.name) or fallback
            if chosen is None:
                chosen = default()
                _logger.info(
                    "Module `%s`: no strategy for graph `%s`; using the default", name, spec.name
                )
            out.append(chosen)
        return out
    if len(strategies) < len(graph_specs):
        raise ValueError(
            f"Module {name!r} recorded {len(graph_specs)} graphs but {len(strategies)} strategies "
            "were given; give one per graph or a dict keyed by graph name"
        )
    if len(strategies) > len(graph_specs):
        _logger.warning(
            "Module `%s`: %d strategies given for %d recorded graphs; the extra ones are unused",
            name,
            len(strategies),
            len(graph_specs),
        )
    return list(strategies[: len(graph_specs)])
