"""`default_strategy`: the one place that says how aitune tunes when nobody chose a strategy.

AOT tuning without a strategy (`aitune_aot.module`) and JIT tuning without `jit_config.strategy` /
`jit_config.backends` (`aitune_jit.config`) both call it; its candidates come from
`aitune_core.backends.defaults.default_backends`, the one place that lists the default backends.

- `default_strategy(device, precision, measure=True, ...)`: `HighestThroughputStrategy` over
  `default_backends`, profiled at the recorded shapes, measuring every candidate against eager in interleaved
  rounds. It keeps eager (raises `NotFasterThanEagerError`) unless a candidate is at least `min_speedup` times
  faster (`DEFAULT_MIN_SPEEDUP` per device type), builds nothing for modules whose eager call takes less than
  `min_eager_latency_us` (`DEFAULT_MIN_EAGER_LATENCY_US`), and stops trying candidates once one qualifies.
  Every candidate's latency is charged `JIT_DISPATCH_OVERHEAD_US`, the host cost of a tuned call's dispatch,
  and with `skip_single_layer` (default) nothing is built for a module that is one torch.nn layer
  (`cost_model.single_torch_layer`: a Linear, an Embedding, a LayerNorm, ...).
  With `measure=False` (AOT's default, where the user asked for a module to be tuned): `FirstWinsStrategy`
  over the same backends, the first that builds and validates wins.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from aitune_core.backends.defaults import default_backends

if TYPE_CHECKING:
    from aitune_core.strategies.strategy import TuneStrategy

#: On CUDA the default strategy stops trying candidates once one is this many times faster than eager at the
#: recorded shapes: each further Inductor compile costs seconds of time-to-tuned while stalling the caller.
#: Barely above 1 because the first fp32 candidate, Inductor with CUDA graphs, is the default-mode compile plus
#: graph replay: once it beats eager, the default mode has nothing left to win (on an H200 with resnet50,
#: vit_base and BERT-base at batch 1/8/32 it was at least as fast as the default mode in all 9 cases). The 2 %
#: margin keeps a tie with eager (within profiling noise) from counting as a win.
CUDA_EARLY_STOP_SPEEDUP = 1.02

#: Margin by which a candidate must beat eager (interleaved medians) to be used, per device type. The CPU
#: margin is wider: a CI-sized CPU is often shared. Two identical functions compared on a busy 2-core machine
#: (a second process spinning) came out between 0.984x and 1.006x in 16 comparisons; 5 % stays well above that
#: spread, so a tie never turns into a tuned module that is slower in the next minute.
DEFAULT_MIN_SPEEDUP = {"cuda": CUDA_EARLY_STOP_SPEEDUP, "cpu": 1.05}

#: Eager calls cheaper than this (microseconds, at the recorded shapes) are not worth a dispatch: a tuned
#: call's lookup of its graph and backend costs tens of microseconds on the host, which a single Embedding,
#: Linear or LayerNorm cannot win back. On CUDA, where event timing counts launch gaps, the bound is lower.
DEFAULT_MIN_EAGER_LATENCY_US = {"cuda": 20.0, "cpu": 50.0}


#: What routing one call to a tuned backend costs the JIT on the host (graph lookup, argument checks), added to
#: every candidate's measured latency: about 8 us per call on a 2-core CPU (a Linear(64, 64) at batch 2: 16.7
#: us plain, 24.7 us through aitune's dispatch with `TorchEagerBackend`).
JIT_DISPATCH_OVERHEAD_US = 10.0


def _device_type(device: torch.device | str | None) -> str:
    return torch.device(device).type if device is not None else "cpu"


def default_min_speedup(device: torch.device | str | None = None) -> float:
    """`DEFAULT_MIN_SPEEDUP` for the device's type (the CPU's for other types)."""
    return DEFAULT_MIN_SPEEDUP.get(_device_type(device), DEFAULT_MIN_SPEEDUP["cpu"])


def default_min_eager_latency_us(device: torch.device | str | None = None) -> float:
    """`DEFAULT_MIN_EAGER_LATENCY_US` for the device's type (the CPU's for other types)."""
    return DEFAULT_MIN_EAGER_LATENCY_US.get(_device_type(device), DEFAULT_MIN_EAGER_LATENCY_US["cpu"])


def default_strategy(
    device: torch.device | str | None = None,
    precision: str | None = None,
    *,
    measure: bool = True,
    min_speedup: float | None = None,
    min_eager_latency_us: float | None = None,
    cuda_early_stop: float | None = None,
    skip_single_layer: bool = True,
    fullgraph: bool = False,
) -> TuneStrategy:
    """The default strategy for `device` (CPU when None); see the module docstring. None for `min_speedup` /
    `min_eager_latency_us` means the device type's default, for `cuda_early_stop` `CUDA_EARLY_STOP_SPEEDUP`;
    `fullgraph` goes to `default_backends`."""
    backends = default_backends(device, precision, fullgraph=fullgraph)
    if not measure:
        from aitune_core.strategies.first_wins import FirstWinsStrategy

        return FirstWinsStrategy(backends)
    from aitune_core.strategies.highest_throughput import HighestThroughputStrategy

    margin = default_min_speedup(device) if min_speedup is None else min_speedup
    early_stop = CUDA_EARLY_STOP_SPEEDUP if cuda_early_stop is None else cuda_early_stop
    stop = max(margin, early_stop) if _device_type(device) == "cuda" else margin
    return HighestThroughputStrategy(
        backends,
        profile_at_recorded_shapes=True,
        stop_when_speedup_over=stop,
        min_speedup=margin,
        min_eager_latency_us=(
            default_min_eager_latency_us(device) if min_eager_latency_us is None else min_eager_latency_us
        ),
        dispatch_overhead_us=JIT_DISPATCH_OVERHEAD_US,
        skip_single_layer=skip_single_layer,
    )
