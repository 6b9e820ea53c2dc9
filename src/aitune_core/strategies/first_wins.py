"""`FirstWinsStrategy`: the first backend (in the given order) that builds and validates wins; no profiling."""

from __future__ import annotations

from typing import TYPE_CHECKING

from aitune_core.strategies.strategy import CandidateReport, TuneReport, TuneStrategy

if TYPE_CHECKING:
    from aitune_core.strategies.tune_job import TuneJob


class FirstWinsStrategy(TuneStrategy):
    """Try backends in priority order; return the first that builds and validates.

    Not every backend handles every model (an ONNX export fails, Inductor hits a graph break with
    `fullgraph=True`, a library is missing): failures are logged and the next backend is tried. When none
    succeeds, `TuningFailedError` lists each backend's cause. Default backends: `default_backends()`.
    """

    display_name = "First Wins Strategy"
    description = "try backends in order, return the first one that builds and validates"
    measures_speed = False

    def _tune_job(self, job: TuneJob) -> TuneReport:
        candidates: list[CandidateReport] = []
        for blueprint in self._backends:
            report, backend = self._try_backend(blueprint, job)
            candidates.append(report)
            if backend is not None:
                return TuneReport(backend=backend, candidates=candidates, selected_index=len(candidates) - 1)
        raise self._failed(job.name, job.graph_spec, candidates)
