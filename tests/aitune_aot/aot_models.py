"""Small models for the AOT tests (importable from a subprocess: `PYTHONPATH=tests/aitune_aot`)."""

import torch


class MLP(torch.nn.Module):
    def __init__(self, features: int = 8, hidden: int = 16, out: int = 4) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(features, hidden)
        self.fc2 = torch.nn.Linear(hidden, out)
        self.register_buffer("offset", torch.zeros(out))

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x))) * scale + self.offset


class Pipeline(torch.nn.Module):
    """An encoder and a head; tests wrap one or both."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = MLP(8, 16, 6)
        self.head = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def build(seed: int = 0) -> Pipeline:
    torch.manual_seed(seed)
    return Pipeline().eval()


# ----------------------------------------------------------------------------- test backends
import dataclasses  # noqa: E402

from aitune_core.backends.backend import Backend, BackendConfig  # noqa: E402
from aitune_core.backends.torch_eager import TorchEagerBackend  # noqa: E402


class CountingBackend(TorchEagerBackend):
    """The eager backend, counting builds and inferences (class-wide) so tests can see who ran a call."""

    builds = 0
    infers = 0

    def _build(self, module, graph_spec, data, cache_dir):
        type(self).builds += 1
        super()._build(module, graph_spec, data, cache_dir)

    def _infer(self, *args, **kwargs):
        type(self).infers += 1
        return super()._infer(*args, **kwargs)

    @classmethod
    def reset(cls) -> None:
        cls.builds = cls.infers = 0


@dataclasses.dataclass(frozen=True)
class ExportedProgramConfig(BackendConfig):
    """No options."""


class ExportedProgramBackend(Backend):
    """Exports the module with torch.export (dynamic batch axis) to an artifact file; runs the loaded program.

    Not a JIT backend: after a checkpoint load it needs only its artifact, not the module.
    """

    config_class = ExportedProgramConfig
    loads = 0

    @property
    def is_jit(self) -> bool:
        return False

    def _build(self, module, graph_spec, data, cache_dir):
        from torch.export import Dim

        sample = max(data, key=lambda s: s.args[0].shape[0])  # a batch > 1, so the batch axis stays dynamic
        dynamic = tuple({0: Dim.DYNAMIC} if isinstance(a, torch.Tensor) else None for a in sample.args)
        program = torch.export.export(module, tuple(sample.args), dynamic_shapes=dynamic)
        cache_dir.mkdir(parents=True, exist_ok=True)
        self.program_path = cache_dir / "program.pt2"
        torch.export.save(program, self.program_path)
        self._runner = program.module()

    def _extra_state(self):
        return {"program": self.program_path}

    def _load_extra_state(self, module, state):
        self.program_path = state["program"]
        self._runner = None

    def _activate(self):
        type(self).loads += 1
        self._runner = torch.export.load(self.program_path).module()

    def _infer(self, *args, **kwargs):
        return self._runner(*args, **kwargs)
