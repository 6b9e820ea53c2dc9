"""`OneBackendStrategy`: exactly one backend; its original exception surfaces if it cannot be built or validated."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aitune_core.backends.backend import Backend
from aitune_core.strategies.strategy import TuneReport, TuneStrategy

if TYPE_CHECKING:
    from aitune_core.strategies.tune_job import TuneJob


class OneBackendStrategy(TuneStrategy):
    """Build and validate one backend. Unlike `FirstWinsStrategy([backend])`, a failure is not wrapped in
    `TuningFailedError`: the original exception (e.g. the `BackendBuildError` or `ValidationError`) is re-raised.

    Default backend: `TorchInductorBackend()`.
    """

    display_name = "One Backend Strategy"
    description = "build and validate exactly one backend; fail with the original error"
    measures_speed = False

    def __init__(self, backend: Backend | None = None) -> None:
        super().__init__([backend] if backend is not None else None)

    @property
    def backend(self) -> Backend:
        return self._backends[0]

    def _tune_job(self, job: TuneJob) -> TuneReport:
        report, backend = self._try_backend(self.backend, job, reraise=True)
        assert backend is not None  # reraise=True: a failure has raised already
        return TuneReport(backend=backend, candidates=[report], selected_index=0)
