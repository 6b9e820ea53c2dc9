"""`TuneStrategy`: picks the backend for one graph of one module; `TuneReport` / `CandidateReport` say how.

A strategy gets the module (with its original forward), the GraphSpec, the recorded samples of that graph, the
device and a cache directory. It builds copies of its blueprint backends (`backend.blueprint_copy()`, so one
blueprint serves many modules and graphs without side effects), validates each against the recorded outputs
(`validate_backend`, unless `enable_correctness_check(False)`), may profile them, and returns the chosen backend
ACTIVE. Candidates that lose are deactivated. Every step is logged in this layout:

    🚀 Tuning graph `0` for module `my-model`:
      number of parameters: ...      precisions: ...      graph_spec tables, num samples, device, cache_dir
      strategy: name / description / backends
    ⏳ Executing strategy `...` on module `...` (graph: 0)
    🤖 backend: TorchInductorBackend()
    🔄 in progress...please wait
    ✅ backend built / ✅ backend validated / ✅ backend profiled - throughput: ...
    ⏱️ completed in 1.23s
    🎯 Strategy ... execution finished:
    ✅ Selected ... for module ... and graph spec Name=0 ...
    ⏱️ Tune `...`: completed in ...

(The thin separator before "🚀 Tuning graph" belongs to the caller, which logs it once per graph.)

While a backend builds, validates or profiles, a rich spinner is shown on stderr - only when stderr is a
terminal, so logs captured by tests or CI never contain control sequences (set `AITUNE_PROGRESS=0` to turn it
off on a terminal too).

A failing candidate (any exception from build, validation or profiling) is logged as a WARNING with its cause
and recorded in its `CandidateReport.error`; a candidate rejected because its values were not close enough also
gets `CandidateReport.closeness` (one line: relative L2 error and limit, elements outside the element-wise
tolerance and how many were allowed, worst error and its cap). When no candidate succeeds, `TuningFailedError`
lists every candidate's cause in one line (for values not close enough: the closeness). `OneBackendStrategy`
instead re-raises the original exception.

Callers pass one `TuneJob` (`run(job)`, `dry_run(job)`); `tune` / `tune_with_report` / `tune_dry_run` take its
six parts as arguments. Custom strategies implement `_tune(module, name, graph_spec, data, device, cache_dir)`
and may return either a `TuneReport` or just the tuned `Backend`; `_pre_tune` / `_post_tune` (same arguments) run
before and after it. The built-in strategies implement `_tune_job(job)`.
"""

from __future__ import annotations

import dataclasses
import time
from abc import ABC
from collections.abc import Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from aitune_core.backends.backend import Backend, BackendState
from aitune_core.errors import TuningFailedError, ValidationError, brief
from aitune_core.log import get_logger, timed
from aitune_core.module_info import count_parameters
from aitune_core.specs.replay_state import replaying
from aitune_core.specs.tables import render_graph_spec, render_sample_metadata
from aitune_core.strategies.progress import progress
from aitune_core.strategies.tune_job import TuneJob
from aitune_core.validation.validator import validate_backend
from aitune_core.validation.value_probes import check_value_probes

if TYPE_CHECKING:
    from aitune_core.profiling import Measurement
    from aitune_core.recording.sample import Sample
    from aitune_core.specs.graph_spec import GraphSpec

_logger = get_logger("strategy")


# ------------------------------------------------------------------------------------------------ reports
@dataclasses.dataclass
class CandidateReport:
    """What happened to one candidate backend."""

    description: str
    key: str
    built: bool = False
    validated: bool = False
    error: str | None = None
    #: for a candidate rejected because its values were not close enough: how close it came, e.g.
    #: "output[0]: rel L2 error 0.0031 (limit 0.001); 40/32768 elements outside rtol=0.001, atol=0.0001
    #: (allowed 32); max abs error 0.012 (cap 0.0041)"
    closeness: str | None = None
    latency_ms: float | None = None
    throughput: float | None = None
    batch_size: int | None = None
    duration_s: float = 0.0

    @property
    def succeeded(self) -> bool:
        return self.built and self.error is None


@dataclasses.dataclass
class TuneReport:
    """The chosen backend, every candidate's report, and the eager baseline when the strategy measured it."""

    backend: Backend
    candidates: list[CandidateReport] = dataclasses.field(default_factory=list)
    eager_latency_ms: float | None = None
    selected_latency_ms: float | None = None
    batch_size: int | None = None
    strategy: str = ""
    selected_index: int | None = None  # index of the selected backend's report in `candidates`

    @property
    def speedup(self) -> float | None:
        """Eager latency / selected latency, when both were measured (> 1 means the backend is faster)."""
        if self.eager_latency_ms is None or self.selected_latency_ms is None or self.selected_latency_ms <= 0:
            return None
        return self.eager_latency_ms / self.selected_latency_ms

    def beats_eager(self, min_speedup: float = 1.0) -> bool | None:
        """Whether the selected backend is faster than eager by at least `min_speedup`; None when not measured.

        A caller may use it to keep the original module when no backend is faster than eager.
        """
        speedup = self.speedup
        return None if speedup is None else speedup >= min_speedup

    @property
    def selected(self) -> CandidateReport | None:
        """The selected backend's `CandidateReport` (None for custom strategies that report no candidates)."""
        if self.selected_index is not None:
            return self.candidates[self.selected_index]
        key = self.backend.key()
        for candidate in reversed(self.candidates):
            if candidate.key == key and candidate.succeeded:
                return candidate
        return None


# ------------------------------------------------------------------------------------------------ helpers
def _precisions(module: Any, graph_spec: GraphSpec) -> str:
    dtypes: set[torch.dtype] = set()
    with suppress(Exception):
        dtypes = {p.dtype for p in module.parameters()} | {b.dtype for b in module.buffers() if b.is_floating_point()}
    if not dtypes:
        dtypes = {t.dtype for t in graph_spec.input_spec.tensors if t.dtype.is_floating_point}
    return ", ".join(sorted(str(d) for d in dtypes)) or "-"


def _identity(blueprint: Backend) -> tuple[str, str]:
    """Description and key of a candidate for the report; a backend whose own describe()/key() raises still gets
    a report (its failure is then reported by the steps that follow, inside the candidate's try)."""
    try:
        description = blueprint.describe()
    except Exception:
        description = type(blueprint).__name__
    try:
        key = blueprint.key()
    except Exception:
        key = type(blueprint).__name__
    return description, key


def _closeness(exc: BaseException) -> str | None:
    """How close a candidate rejected for its values came (`closeness_summary` of `criterion.mismatch_error`)."""
    summary = getattr(exc, "closeness_summary", None) if isinstance(exc, ValidationError) else None
    return summary if isinstance(summary, str) else None


def _cause(candidate: CandidateReport) -> str:
    """A candidate's failure in one line; for values not close enough, how close they came (the full message,
    with indices and values, is in the candidate's WARNING and `CandidateReport.error`)."""
    if candidate.closeness:
        return f"ValidationError: values not close enough: {candidate.closeness}"
    return candidate.error or "not selected"


def _failure_message(name: str, graph_spec: GraphSpec, candidates: Sequence[CandidateReport]) -> str:
    if not candidates:
        return f"No backend to try for module `{name}` (graph {graph_spec.name}): the strategy has no backends"
    lines = [f"No backend could be built and validated for module `{name}` (graph {graph_spec.name}):"]
    lines += [f"  - {c.description}: {_cause(c)}" for c in candidates]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ strategy
class TuneStrategy(ABC):  # noqa: B024 - one of _tune / _tune_job is required: checked in __init__
    """Base of tuning strategies; see the module docstring."""

    #: shown as `name:` in the logs
    display_name: ClassVar[str] = "Tune Strategy"
    #: shown as `description:` in the logs
    description: ClassVar[str] = ""
    #: True for strategies that profile candidates (and fill `TuneReport.eager_latency_ms`)
    measures_speed: ClassVar[bool] = False

    def __init__(self, backends: Sequence[Backend] | None = None) -> None:
        backends = list(backends) if backends is not None else self.default_backends()
        if not backends:
            raise ValueError(f"{type(self).__name__} needs at least one backend (pass None for the defaults)")
        for backend in backends:
            if not isinstance(backend, Backend):
                raise TypeError(f"{type(self).__name__} expects Backend instances, got {type(backend).__name__}")
            if backend.state is not BackendState.INIT:
                raise ValueError(
                    f"{type(self).__name__}: backend {backend.describe()} is {backend.state.name}; strategies need "
                    "unbuilt (INIT) backends to copy"
                )
        if not self._implements_tune() and type(self)._tune_job is TuneStrategy._tune_job:
            raise TypeError(f"Can't instantiate {type(self).__name__}: a strategy implements _tune (or _tune_job)")
        self._backends: list[Backend] = backends
        self._correctness_check = True

    @classmethod
    def default_backends(cls) -> list[Backend]:
        """Candidates when none are given: `aitune_core.backends.defaults.default_backends()` (CPU list)."""
        from aitune_core.backends.defaults import default_backends

        return default_backends()

    @property
    def backends(self) -> list[Backend]:
        """The blueprint backends, in the order they are tried."""
        return list(self._backends)

    def enable_correctness_check(self, enabled: bool) -> None:
        """Validate each built backend against the recorded outputs (on by default)."""
        self._correctness_check = bool(enabled)

    def __repr__(self) -> str:
        return f"{type(self).__name__}([{', '.join(_identity(b)[0] for b in self._backends)}])"

    # -------------------------------------------------------------------------------------------- API
    def run(self, job: TuneJob) -> TuneReport:
        """Tune one graph of one module (see `TuneJob`); returns the `TuneReport` (the chosen backend, ACTIVE;
        candidates; eager baseline and speed-up where measured). Raises `TuningFailedError`."""
        if not job.samples:
            raise TuningFailedError(
                f"No samples recorded for module `{job.name}` (graph {job.graph_spec.name}); cannot tune"
            )
        self._log_header(job)
        strategy = type(self).__name__
        _logger.info("⏳ Executing strategy `%s` on module `%s` (graph: %s)", strategy, job.name, job.graph_spec.name)
        arguments = job.arguments()  # one list of samples for the three hooks, as before
        with timed(_logger, f"Tune `{strategy}`"), replaying(job.graph_spec):  # as the program called it
            self._pre_tune(*arguments)
            result = self._tune(*arguments) if self._implements_tune() else self._tune_job(job)
            report = result if isinstance(result, TuneReport) else TuneReport(backend=result)
            if not report.strategy:
                report.strategy = strategy
            self._post_tune(*arguments)
            self._log_selected(report, job.name, job.graph_spec)
        return report

    def dry_run(self, job: TuneJob) -> None:
        """Log what `run(job)` would do (module, graph, samples, backends) without building anything."""
        self._log_header(job)
        _logger.info(
            "🧪 Dry run: strategy `%s` would try %d backend(s) on module `%s` (graph: %s); nothing is built",
            type(self).__name__,
            len(self._backends),
            job.name,
            job.graph_spec.name,
        )

    def tune(
        self,
        module: torch.nn.Module,
        name: str,
        graph_spec: GraphSpec,
        data: list[Sample],
        device: torch.device | str,
        cache_dir: Path | str,
    ) -> Backend:
        """Tune one graph of `module`; returns the chosen backend, ACTIVE. Raises `TuningFailedError`."""
        return self.run(TuneJob.of(module, name, graph_spec, data, device, cache_dir)).backend

    def tune_with_report(
        self,
        module: torch.nn.Module,
        name: str,
        graph_spec: GraphSpec,
        data: list[Sample],
        device: torch.device | str,
        cache_dir: Path | str,
    ) -> TuneReport:
        """Like `tune`, returning the `TuneReport` (candidates, eager baseline, speedup)."""
        return self.run(TuneJob.of(module, name, graph_spec, data, device, cache_dir))

    def tune_dry_run(
        self,
        module: torch.nn.Module,
        name: str,
        graph_spec: GraphSpec,
        data: list[Sample],
        device: torch.device | str,
        cache_dir: Path | str,
    ) -> None:
        """Log what `tune` would do (module, graph, samples, backends) without building anything."""
        self.dry_run(TuneJob.of(module, name, graph_spec, data, device, cache_dir))

    # -------------------------------------------------------------------------------------------- hooks
    def _pre_tune(  # noqa: B027 - optional hook
        self,
        module: torch.nn.Module,
        name: str,
        graph_spec: GraphSpec,
        data: list[Sample],
        device: torch.device,
        cache_dir: Path,
    ) -> None:
        """Called before `_tune` (override to prepare, e.g. estimate a batch size)."""

    def _tune(
        self,
        module: torch.nn.Module,
        name: str,
        graph_spec: GraphSpec,
        data: list[Sample],
        device: torch.device,
        cache_dir: Path,
    ) -> TuneReport | Backend:
        """Choose, build and activate a backend for this graph (build copies of the blueprints): the hook custom
        strategies implement. The built-in strategies implement `_tune_job` instead; this runs it for them (so a
        subclass of one may override `_tune` and call `super()._tune(...)`)."""
        return self._tune_job(TuneJob.of(module, name, graph_spec, data, device, cache_dir))

    def _tune_job(self, job: TuneJob) -> TuneReport | Backend:
        """`_tune` for strategies that take the job as one object (the built-in ones)."""
        raise NotImplementedError(f"{type(self).__name__} implements neither _tune nor _tune_job")

    def _implements_tune(self) -> bool:
        """True when a class of this strategy overrides `_tune` (a custom strategy): `run` calls it."""
        return type(self)._tune is not TuneStrategy._tune

    def _post_tune(  # noqa: B027 - optional hook
        self,
        module: torch.nn.Module,
        name: str,
        graph_spec: GraphSpec,
        data: list[Sample],
        device: torch.device,
        cache_dir: Path,
    ) -> None:
        """Called after a successful `_tune`."""

    # -------------------------------------------------------------------------------------------- building blocks
    def _try_backend(
        self,
        blueprint: Backend,
        job: TuneJob,
        *,
        profile: Callable[[Backend], Measurement] | None = None,
        on_success: Callable[[CandidateReport, Backend], None] | None = None,
        reraise: bool = False,
    ) -> tuple[CandidateReport, Backend | None]:
        """Build (a copy of) `blueprint`, validate it and optionally profile it; logs every step.

        Returns the report and the ACTIVE backend, or `(report, None)` when any step failed (the cause is in
        `report.error`). `on_success(report, backend)` runs before the step's "⏱️ completed" line (strategies log
        "🎯 new best ..." there). With `reraise`, the original exception propagates after it is logged.
        """
        description, key = _identity(blueprint)
        report = CandidateReport(description=description, key=key)
        _logger.info("🤖 backend: %s", description)
        _logger.info("🔄 in progress...please wait")
        backend: Backend | None = None
        start = time.perf_counter()
        try:
            with timed(_logger):
                try:  # every per-candidate step: a backend that cannot even be copied is a candidate failure
                    backend = blueprint.blueprint_copy()
                    with progress(f"Building {description}"):
                        backend.build(job.module, job.graph_spec, job.data, job.device, job.cache_dir / backend.key())
                    report.built = True
                    _logger.info("✅ backend built")
                    if self._correctness_check:
                        with progress(f"Validating {description}"):
                            validate_backend(backend, job.graph_spec, job.data)
                            if backend.exports_graph:
                                check_value_probes(backend, job)
                        report.validated = True
                        _logger.info("✅ backend validated")
                    if profile is not None:
                        with progress(f"Profiling {description}"):
                            measurement = profile(backend)
                        report.latency_ms = measurement.latency_ms
                        report.throughput = measurement.throughput
                        report.batch_size = measurement.batch_size
                        _logger.info(
                            "✅ backend profiled - throughput: %.2f samples/s, batch size: %d (latency %.3f ms)",
                            measurement.throughput,
                            measurement.batch_size,
                            measurement.latency_ms,
                        )
                    if on_success is not None:
                        on_success(report, backend)
                except Exception as exc:
                    report.error = brief(exc)
                    report.closeness = _closeness(exc)
                    _logger.warning("❌ backend %s failed: %s", description, report.error,
                                    extra={"aitune_failure": exc})  # (the JIT's tuner reads it: `held_warnings`)
                    _logger.debug("backend %s failed", description, exc_info=True)
                    self._discard(backend)
                    backend = None
                    if reraise:
                        raise
        finally:
            report.duration_s = time.perf_counter() - start
        return report, backend

    @staticmethod
    def _discard(backend: Backend | None) -> None:
        """Release a candidate that is not (or no longer) the selected one."""
        if backend is None:
            return
        try:
            if backend.state is BackendState.ACTIVE:
                backend.deactivate()
            else:
                Backend._free_memory()
        except Exception as exc:  # releasing must never hide the real outcome
            _logger.debug("Could not deactivate %s: %s", _identity(backend)[0], exc)

    @staticmethod
    def _failed(name: str, graph_spec: GraphSpec, candidates: list[CandidateReport]) -> TuningFailedError:
        error = TuningFailedError(_failure_message(name, graph_spec, candidates))
        error.candidates = candidates  # type: ignore[attr-defined]
        return error

    # -------------------------------------------------------------------------------------------- logging
    def _log_header(self, job: TuneJob) -> None:
        module, name, graph_spec, data, device, cache_dir = job.arguments()
        _logger.info("🚀 Tuning graph `%s` for module `%s`:", graph_spec.name, name)
        _logger.info("  number of parameters: %d", count_parameters(module))
        with suppress(Exception):
            _logger.info("  number of layers: %d", len(list(module.children())))
        _logger.info("  precisions: %s", _precisions(module, graph_spec))
        _logger.info("  graph_spec:")
        _logger.info("  input_spec:\n%s", render_sample_metadata(graph_spec.input_spec))
        _logger.info("  output_spec:\n%s", render_sample_metadata(graph_spec.output_spec))
        _logger.info("  num samples: %d", len(data))
        _logger.info("  device: %s", device)
        _logger.info("  cache_dir: %s", cache_dir)
        _logger.info("  strategy:")
        _logger.info("    name: %s", self.display_name)
        _logger.info("    description: %s", self.description)
        _logger.info("    backends:")
        for backend in self._backends:
            _logger.info("      %s", _identity(backend)[0])

    def _log_selected(self, report: TuneReport, name: str, graph_spec: GraphSpec) -> None:
        _logger.info("🎯 Strategy %s execution finished:", type(self).__name__)
        _logger.info(
            "✅ Selected %s for module %s and graph spec %s",
            report.backend.describe(),
            name,
            render_graph_spec(graph_spec),
        )
        if report.selected_latency_ms is not None:
            selected = report.selected
            if selected is not None and selected.throughput is not None:
                _logger.info("Batch size: %s, throughput: %.2f samples/s", selected.batch_size, selected.throughput)
            if report.speedup is not None:
                _logger.info(
                    "Latency: %.3f ms (original module: %.3f ms), speedup %.2fx",
                    report.selected_latency_ms,
                    report.eager_latency_ms,
                    report.speedup,
                )
