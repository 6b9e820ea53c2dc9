"""`TorchEagerBackend`: runs the original module unchanged (the baseline every strategy can fall back to)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from aitune_core.backends.backend import Backend, BackendConfig

if TYPE_CHECKING:
    from aitune_core.recording.sample import Sample
    from aitune_core.specs.graph_spec import GraphSpec


@dataclasses.dataclass(frozen=True)
class TorchEagerBackendConfig(BackendConfig):
    """The eager backend has no options."""


class TorchEagerBackend(Backend):
    """Calls the original module (hooks included); nothing is built, so building never fails.

    The checkpoint holds only the configuration: the module (and its weights) belongs to the user and is saved by the
    checkpoint layer, and `from_dict` needs it back.
    """

    config_class = TorchEagerBackendConfig
    checks_object_layouts = True  # (it runs the original forward)

    def __init__(self, config: TorchEagerBackendConfig | None = None) -> None:
        super().__init__(config)
        self._module: torch.nn.Module | None = None

    @property
    def compiled_for_structure(self) -> bool:
        return False  # it runs the module as it is

    def _build(self, module: torch.nn.Module, graph_spec: GraphSpec, data: list[Sample], cache_dir: Path) -> None:
        if not callable(module):
            raise TypeError(f"{self.name} needs a callable module, got {type(module).__name__}")
        self._module = module

    def _infer(self, *args: Any, **kwargs: Any) -> Any:
        return self._module(*args, **kwargs)  # type: ignore[misc]

    def _load_extra_state(self, module: torch.nn.Module | None, state_dict: dict[str, Any]) -> None:
        if module is None:
            raise ValueError(f"{self.name}.from_dict needs the original module")
        self._module = module
