"""`TuneJob`: one graph of one module to tune - everything a strategy needs, as one frozen object.

Why: the module, its name, the graph spec, the recorded samples, the device and the cache folder travel together
from the caller (the JIT tuner, the AOT `Module`) through the strategy to each candidate backend. One object says
so once (as torchao's `quantize_(model, config)` passes one config), instead of six arguments in every signature.
`TuneStrategy.run(job)` takes it; the documented six-argument methods (`tune`, `tune_with_report`,
`tune_dry_run`) and hooks (`_pre_tune`, `_tune`, `_post_tune`) stay for custom code (`arguments()`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from aitune_core.recording.sample import Sample
    from aitune_core.specs.graph_spec import GraphSpec


@dataclasses.dataclass(frozen=True, eq=False)
class TuneJob:
    """Tune graph `graph_spec` of `module` (called `name` in logs and reports) from its recorded `samples`, on
    `device`, with built artifacts under `cache_dir`. Build one with `TuneJob.of(...)`, which accepts what the
    six-argument API accepts (a device string, a path string, any iterable of samples)."""

    module: torch.nn.Module
    name: str
    graph_spec: GraphSpec
    samples: tuple[Sample, ...]
    device: torch.device
    cache_dir: Path

    @classmethod
    def of(
        cls,
        module: torch.nn.Module,
        name: str,
        graph_spec: GraphSpec,
        data: Iterable[Sample],
        device: torch.device | str,
        cache_dir: Path | str,
    ) -> TuneJob:
        return cls(module, name, graph_spec, tuple(data), torch.device(device), Path(cache_dir))

    @property
    def data(self) -> list[Sample]:
        """The samples as a list (a new one per call: a strategy may reorder or slice its copy)."""
        return list(self.samples)

    def arguments(self) -> tuple[torch.nn.Module, str, GraphSpec, list[Sample], torch.device, Path]:
        """`(module, name, graph_spec, data, device, cache_dir)`: the arguments of the six-argument methods and
        hooks of `TuneStrategy`."""
        return self.module, self.name, self.graph_spec, self.data, self.device, self.cache_dir
