"""`TorchInductorBackend`: `torch.compile(module, backend="inductor")` with the shapes of the recorded graph.

Build
    The module is wrapped with `torch.compile(..., backend="inductor", fullgraph, dynamic, mode, options)` and every
    recorded sample is run through it exactly once (modules may be stateful). Before those calls the batch and
    dynamic axes of the GraphSpec are marked on the sample tensors with `mark_dynamic(t, axis, min=, max=)`, the
    recorded range, so one dynamic graph serves the range (the marks come off after each call: `dynamic_marks`).
    Dynamo specializes sizes 0 and 1: an axis is marked only where the sample's size is >= 2 (`min=max(2, recorded
    min)`), and a recorded size of 1 gets a graph of its own. If the model forces an axis static
    (`ConstraintViolationError`), the build retries once with `maybe_mark_dynamic`. `dynamic=False` disables marking
    (always specialize). An int / float argument whose value varies between the graph's calls (`free_scalars`)
    compiles twice, as a constant then as a symbol; a third value compiling again fails the build
    (`scalar_specialization`). CUDA-graph modes refuse such a graph (a recording per value).

Inference
    Runs the compiled module (inside `torch.autocast` when enabled; floating outputs are cast back to the original
    dtypes). Grad and inference mode are guarded and the warm-up runs under `torch.no_grad()`: the first call in
    another mode compiles once more, its inputs marked the same way (one compile per mode, not per shape), as is
    the first call after `activate()` / `deploy()`; a graph recorded under inference mode compiles it in the build.
    Autograd is left as the caller has it. `serve` never compiles otherwise: the plain forward answers (`run_only`).

CUDA graphs
    With `mode="reduce-overhead"`, `mode="max-autotune"` or the option `triton.cudagraphs` on a CUDA device, replays
    overwrite their output buffers, so `_infer` clones every output (one device copy per call, included in measured
    throughput). `torch.compiler.cudagraph_mark_step_begin()` is never called: the first call of it in a process
    switches every CUDA-graph function - the user's own too - to counting generations by mark steps only, and a
    user's function then re-records instead of replaying. A module whose calls change their arguments (a KV cache,
    `Sample.mutates_inputs`) is refused: what it writes into them would be a replay buffer.

One compiled entry per backend
    The module is compiled through `isolated_entry(module)`, a code object of its own (dynamo keeps entries per code
    object, and a class's `forward` is shared by every instance and every equal `torch.compile`), so this
    backend's graphs, CUDA-graph recordings and recompile count are its own.

Recompile limit, batch sizes
    Dynamo keeps at most 8 entries per code object, then runs eager; the warm-up and the first call after
    activation raise that limit while they run (`recompile_limit`). Without CUDA graphs the build also calls the
    backend at the batch range's ends and powers of two between (`batch_probes`): sizes torch specialized compile
    here, not in a serving thread's call.

Deactivate, checkpoint (`to_dict` / `from_dict`)
    `deactivate()` drops the compiled wrapper and the samples (`torch._dynamo.reset()` is global: never called). A
    checkpoint stores the configuration, output dtypes, forward binder and dynamic-axis marks (the module is the
    user's, for `from_dict`); it compiles again, lazily, at the first call after loading.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from aitune_core.backends.backend import Backend, BackendConfig
from aitune_core.backends.batch_probes import batch_probes
from aitune_core.backends.compile_regions import CompileRegions, compiles_whole
from aitune_core.backends.dynamic_marks import DynamicMarks
from aitune_core.backends.gapped_inputs import pack
from aitune_core.backends.inductor_failures import constraint_violation, region_failure
from aitune_core.backends.inductor_options import check_from_file, check_options
from aitune_core.backends.isolated_entry import isolated_entry
from aitune_core.backends.recompile_limit import raised_recompile_limit
from aitune_core.backends.run_only import run_only, served
from aitune_core.backends.scalar_specialization import ScalarSpecialization
from aitune_core.log import get_logger
from aitune_core.specs.binding import Binder
from aitune_core.specs.tensor_spec import dtype_from_str
from aitune_core.specs.tree import flatten_values, tree_map, unflatten
from aitune_core.validation.tensor_slots import holds_state_object

if TYPE_CHECKING:
    from aitune_core.recording.sample import Sample
    from aitune_core.specs.graph_spec import GraphSpec

_logger = get_logger("backend.inductor")

#: `torch.compile` modes (see `torch._inductor.list_mode_options()`).
VALID_MODES: tuple[str, ...] = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_CUDAGRAPH_MODES = frozenset({"reduce-overhead", "max-autotune"})
AUTOCAST_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)


def _as_dtype(value: Any, field_name: str) -> Any:
    if isinstance(value, str):
        try:
            return dtype_from_str(value)
        except ValueError as exc:
            raise ValueError(f"{field_name}: {exc}") from None
    return value


@dataclasses.dataclass(frozen=True)
class TorchInductorBackendConfig(BackendConfig):
    """Configuration of `torch.compile` with the Inductor backend.

    Args:
        fullgraph: require one graph for the whole module (graph breaks fail the build).
        dynamic: `torch.compile(dynamic=...)`; None lets dynamo decide (the recorded batch/dynamic axes are still
            marked dynamic), False always specializes (no marking), True traces as dynamically as possible.
        mode: one of `VALID_MODES`; cannot be combined with `options`.
        options: Inductor options (`torch._inductor.list_options()`); cannot be combined with `mode`.
        autocast_enabled: run inference inside `torch.autocast`.
        autocast_dtype: `torch.float16` or `torch.bfloat16` (or its string, from a JSON config); None means the
            device's autocast default (float16 on CUDA, bfloat16 on CPU).
        regions: trace identical sibling blocks once, as nested compile regions (`compile_regions`); a compile
            that fails with them is tried again without. On a GPU, a graph whose calls change their arguments
            (a decoding step) compiles whole regardless: its host work is in every call.
    """

    fullgraph: bool = False
    dynamic: bool | None = None
    mode: str | None = None
    options: dict[str, Any] | None = None
    autocast_enabled: bool = False
    autocast_dtype: torch.dtype | None = None
    regions: bool = True

    def __post_init__(self) -> None:
        if self.mode is not None and self.options is not None:
            raise ValueError(
                "TorchInductorBackendConfig: cannot specify both 'mode' and 'options'. Use 'mode' for a predefined "
                "configuration or 'options' for custom Inductor options, not both."
            )
        if self.mode is not None and self.mode not in VALID_MODES:
            raise ValueError(
                f"TorchInductorBackendConfig: unknown mode {self.mode!r}; valid modes: {', '.join(VALID_MODES)}"
            )
        check_options(self.options)
        for name in ("fullgraph", "autocast_enabled", "regions"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"TorchInductorBackendConfig: {name} must be a bool, got {getattr(self, name)!r}")
        if self.dynamic is not None and not isinstance(self.dynamic, bool):
            raise ValueError(f"TorchInductorBackendConfig: dynamic must be True, False or None, got {self.dynamic!r}")
        dtype = _as_dtype(self.autocast_dtype, "TorchInductorBackendConfig.autocast_dtype")
        if dtype is not None:
            if not isinstance(dtype, torch.dtype) or dtype not in AUTOCAST_DTYPES:
                raise ValueError(
                    "TorchInductorBackendConfig: autocast_dtype must be torch.float16 or torch.bfloat16, "
                    f"got {self.autocast_dtype!r}"
                )
            object.__setattr__(self, "autocast_dtype", dtype)

    def check_from_file(self) -> None:
        check_from_file(self.options)

    @property
    def wants_cudagraphs(self) -> bool:
        if self.mode in _CUDAGRAPH_MODES:
            return True
        options = self.options or {}
        nested = options.get("triton")
        return bool(options.get("triton.cudagraphs") or (isinstance(nested, dict) and nested.get("cudagraphs")))


# (tensor position in input_spec.tensors, axis, min, max)
_Mark = tuple[int, int, int, int]


def _varying_sequence_axis(graph_spec: GraphSpec) -> str | None:
    """How a non-leading input axis of the graph varies (a sequence length), or None when only axis 0 does (the
    batch, whatever name axis inference gave it: a 0-d input next to it makes it `dim0`)."""
    for spec in graph_spec.input_spec.tensors:
        for axis in spec.dynamic_axes():
            if axis == 0:
                continue
            low, high = spec.min_shape[axis], spec.max_shape[axis]
            if high > low:
                return f"axis {axis} of {spec.name or 'an input'} takes {high - low + 1} sizes ({low}..{high})"
    return None


class TorchInductorBackend(Backend):
    """Compiles the module with `torch.compile(backend="inductor")`; see the module docstring for the details."""

    config_class = TorchInductorBackendConfig
    checks_object_layouts = True  # (dynamo guards them: a call that misses runs the plain forward, or compiles)
    STATE_OUTPUT_DTYPES: ClassVar[str] = "output_dtypes"
    STATE_DYNAMIC_MARKS: ClassVar[str] = "dynamic_marks"
    STATE_BINDER: ClassVar[str] = "binder"

    def __init__(self, config: TorchInductorBackendConfig | None = None) -> None:
        super().__init__(config)
        self._module: torch.nn.Module | None = None
        self._binder: Binder | None = None
        self._compiled: Any = None
        # the function compiled: the module under a code object of its own (module doc), as long as this backend
        self._entry: Any = None
        self._serving: Any = None  # `_entry` in dynamo's run-only mode (`serve`)
        self._output_dtypes: list[torch.dtype] = []
        self._marks: list[_Mark] = []
        self._soft_marks = False
        self._compiled_modes: set[tuple[bool, bool]] = set()  # (grad, inference mode) states compiled: `_infer`
        self._cudagraphs = False
        self._packs = False  # program calls get packed copies of gapped tensor arguments (`gapped_inputs`)
        self._regions_off = False  # a compile with regions failed: this backend compiles without them
        self._regions: CompileRegions | None = None  # the classes marked while this backend is active
        #: what its compile traced once per repeated block class (`CompileRegions.describe`), for the history
        self.regions_summary: str | None = None

    @property
    def config(self) -> TorchInductorBackendConfig:
        return self._config  # type: ignore[return-value]

    @property
    def traces_whole_graph(self) -> bool:
        return bool(self.config.fullgraph)

    @property
    def pins_output_dtypes(self) -> bool:
        return bool(self.config.autocast_enabled)  # (`_restore_output_dtypes`)

    def tolerance(self, dtype: torch.dtype) -> Any:
        """With autocast, floating outputs are computed in the autocast dtype: validate with its tolerance."""
        from aitune_core.validation.tolerance import default_tolerance

        base = default_tolerance(dtype, self._device)
        if self.config.autocast_enabled and (dtype.is_floating_point or dtype.is_complex):
            return base.widen(default_tolerance(self._autocast_dtype(), self._device))
        return base

    # ------------------------------------------------------------------------------ helpers
    def _autocast_dtype(self) -> torch.dtype:
        if self.config.autocast_dtype is not None:
            return self.config.autocast_dtype
        device_type = self._device.type if self._device is not None else "cpu"
        return torch.float16 if device_type == "cuda" else torch.bfloat16

    def _compile(self) -> Any:
        cfg = self.config
        if self._entry is None:
            assert self._module is not None
            self._entry = isolated_entry(self._module, f"aitune_inductor_{type(self._module).__name__}")
        self._serving = run_only(self._entry)
        return torch.compile(
            self._entry,
            backend="inductor",
            fullgraph=cfg.fullgraph,
            dynamic=cfg.dynamic,
            mode=cfg.mode,
            options=dict(cfg.options) if cfg.options is not None else None,
        )

    @staticmethod
    def _marks_for(graph_spec: GraphSpec) -> list[_Mark]:
        return [(position, axis, spec.min_shape[axis], spec.max_shape[axis])
                for position, spec in enumerate(graph_spec.input_spec.tensors) for axis in spec.non_static_axes()
                if spec.max_shape[axis] > spec.min_shape[axis]]

    @contextlib.contextmanager
    def _marked(self, args: tuple[Any, ...], kwargs: dict[str, Any], *, soft: bool) -> Iterator[None]:
        """While the block runs, the recorded dynamic axes are marked on the call's own tensors, taken off after
        (`dynamic_marks`). The call keeps its own argument objects: marking detached aliases rebuilt its containers,
        so a forward filling the dict it is given (sentence-transformers' modules fill the caller's
        `BatchEncoding`) filled a copy - on the first call in a new grad mode, the caller's dict stayed unfilled."""
        binder = self._binder
        if not self._marks or binder is None or self.config.dynamic is False:
            yield
            return
        try:
            values, _bound = flatten_values(binder.bind(args, kwargs))
        except TypeError:
            yield
            return
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        marks = DynamicMarks()
        try:
            for position, axis, low, high in self._marks:
                if position >= len(tensors):
                    continue
                tensor = tensors[position]
                if tensor.requires_grad or axis >= tensor.dim():
                    continue
                if int(tensor.shape[axis]) < 2:  # dynamo specializes 0 and 1; this call gets its own graph
                    continue
                marks.keep(tensor)
                lower = max(2, low)
                if soft or high <= lower:
                    torch._dynamo.maybe_mark_dynamic(tensor, axis)
                else:
                    torch._dynamo.mark_dynamic(tensor, axis, min=lower, max=high)
            yield
        finally:
            marks.take_off()

    def _restore_output_dtypes(self, output: Any, *, own: bool = False) -> Any:
        """Cast floating outputs back to the dtypes the original module returned. With `own` (CUDA graphs), every
        output tensor is also made the caller's: a cast already is a new tensor, the others are cloned - one
        copy per output, never a cast followed by a clone."""
        if type(output) is torch.Tensor and len(self._output_dtypes) == 1:  # the common case, on every call's path
            want = self._output_dtypes[0]
            if output.dtype != want and output.is_floating_point() and want.is_floating_point:
                return output.to(want)
            return output.clone() if own else output
        values, treedef = flatten_values(output)
        dtypes = iter(self._output_dtypes)
        changed = False
        for index, value in enumerate(values):
            if isinstance(value, torch.Tensor):
                want = next(dtypes, None)
                if want is not None and value.dtype != want and value.is_floating_point() and want.is_floating_point:
                    values[index] = value.to(want)
                    changed = True
                elif own:
                    values[index] = value.clone()
                    changed = True
        return unflatten(treedef, values) if changed else output

    def _run(self, args: tuple[Any, ...], kwargs: dict[str, Any], compiled: Any = None) -> Any:
        compiled = self._compiled if compiled is None else compiled
        if self.config.autocast_enabled:
            with torch.autocast(device_type=self._device.type, dtype=self._autocast_dtype()):  # type: ignore[union-attr]
                output = compiled(*args, **kwargs)
            return self._restore_output_dtypes(output, own=self._cudagraphs)
        output = compiled(*args, **kwargs)
        if self._cudagraphs:
            # the next replay overwrites the graph's output buffers: give the caller tensors it owns
            # (a bare tensor, the common case, skips the pytree walk: this is on every call's path)
            output = output.clone() if type(output) is torch.Tensor else tree_map(torch.Tensor.clone, output)
        return output

    def _order_for_warmup(self, graph_spec: GraphSpec, data: list[Sample]) -> list[Sample]:
        """Largest shapes first, so that the first compile sees every marked axis at size >= 2."""

        def size_key(sample: Sample) -> tuple[int, int]:
            try:
                tensors = graph_spec.input_tensors(sample.args, sample.kwargs)
            except Exception:
                return (0, 0)
            small = sum(1 for t in tensors for s in t.shape if s < 2)
            return (small, -sum(t.numel() for t in tensors))

        return sorted(data, key=size_key)

    # ------------------------------------------------------------------------------ hooks
    def _build(self, module: torch.nn.Module, graph_spec: GraphSpec, data: list[Sample], cache_dir: Path) -> None:
        self._module = module
        self._entry = None
        self._binder = graph_spec.binder
        self._output_dtypes = [spec.dtype for spec in graph_spec.output_spec.tensors]
        self._marks = self._marks_for(graph_spec)
        self._cudagraphs = self.config.wants_cudagraphs and self._device is not None and self._device.type == "cuda"
        varying = _varying_sequence_axis(graph_spec)
        if self._cudagraphs and any(getattr(sample, "mutates_inputs", False) or holds_state_object(sample.output)
                                    for sample in data):
            raise ValueError("CUDA graphs replay into buffers of their own, and this module's calls change their "
                             "arguments or return an object holding tensors (a KV cache): those tensors would be "
                             "overwritten by the next replay, and a growing cache is a new graph per size")
        if self._cudagraphs and graph_spec.free_scalars():
            raise ValueError(f"CUDA graphs record one graph per value of {', '.join(graph_spec.free_scalars())}, "
                             "whose value changes between calls (a free scalar): on an H100 a UNet served this way "
                             "in the background failed in the serving thread's first recording (AssertionError)")
        if self._cudagraphs and varying is not None:
            raise ValueError(f"CUDA graphs record one graph per size, and {varying}: a graph this backend would "
                             "serve by recording again and again (on an H100, BERT at lengths 32..128 ran 2.4x "
                             "slower than Inductor without CUDA graphs)")
        self._regions_off = compiles_whole(data, self._device)
        self._packs = not any(getattr(sample, "mutates_inputs", False) for sample in data)  # (`gapped_inputs`)
        ordered = self._order_for_warmup(graph_spec, data)
        try:
            used = self._mark_regions()
            self._compiled = self._compile()
            try:
                self._warm_up(ordered, graph_spec)
            except Exception as exc:
                if not used or not region_failure(exc):
                    raise
                _logger.info("%s: the compile with %d blocks as nested compile regions failed (%s); compiling "
                             "without", self.describe(), used, str(exc).splitlines()[0] if str(exc) else exc)
                self._unmark_regions()
                self._regions_off = True
                self.regions_summary = None
                self._soft_marks = False
                self._compiled = self._compile()
                self._warm_up(ordered, graph_spec)
        except BaseException:
            self._unmark_regions()  # a failed (or cancelled) build holds nothing
            raise
        self._compiled_modes = {(False, False)}  # the warm-up ran under no_grad
        if graph_spec.inference_mode:  # the program calls it under inference_mode: compile that mode here too
            args, kwargs = ordered[0].inputs_to(self._device)
            with torch.inference_mode():
                self._infer(*args, **kwargs)
        if not self._cudagraphs:  # (CUDA graphs would record each size here, for this thread only)
            self._warm_up_sizes(graph_spec, data)

    def _warm_up_sizes(self, graph_spec: GraphSpec, data: list[Sample]) -> None:
        """Compile here the batch sizes of the range that no recorded call showed (`batch_probes`); best effort."""
        with torch.no_grad(), raised_recompile_limit():
            for args, kwargs in batch_probes(graph_spec, data, self._device):
                try:
                    with self._marked(args, kwargs, soft=self._soft_marks):
                        self._run(args, kwargs)
                except Exception as exc:  # a size the model refuses: its calls fail the same way eagerly
                    _logger.debug("%s: batch-size warm-up call failed (%r)", self.describe(), exc)

    def _mark_regions(self) -> int:
        """Mark the repeated blocks as nested compile regions for as long as this backend is active (see
        `compile_regions`); returns how many blocks are marked."""
        self._unmark_regions()
        if not self.config.regions or self._regions_off or self._module is None:
            return 0
        regions = self._regions = CompileRegions.install(self._module).held_by(self)
        self.regions_summary = regions.describe() if regions.blocks else None
        if regions.blocks:
            _logger.debug("%s: %d blocks in %d groups compile as nested regions", self.describe(),
                          regions.blocks, regions.groups)
        return regions.blocks

    def _unmark_regions(self) -> None:
        if self._regions is not None:
            self._regions.remove()
            self._regions = None

    def _warm_up(self, ordered: list[Sample], graph_spec: GraphSpec) -> None:
        device = self._device
        scalars = ScalarSpecialization(graph_spec, self._entry)
        with torch.no_grad(), raised_recompile_limit():
            for index, sample in enumerate(ordered):
                args, kwargs = sample.inputs_to(device) if device is not None else (sample.args, sample.kwargs)
                args, kwargs = tuple(args), dict(kwargs)
                try:
                    with self._marked(args, kwargs, soft=self._soft_marks), scalars.call(args, kwargs):
                        self._run(args, kwargs)
                except Exception as exc:
                    # dynamo raises before running anything when a marked axis is specialized by the model's
                    # code: hint instead of constrain and retry this sample once
                    if self._soft_marks or not constraint_violation(exc):
                        raise
                    _logger.info(
                        "%s: the model specializes a recorded dynamic axis; retrying with maybe_mark_dynamic (%s)",
                        self.describe(),
                        str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                    )
                    self._soft_marks = True
                    self._compiled = self._compile()
                    with self._marked(args, kwargs, soft=True):
                        self._run(args, kwargs)
                _logger.debug("%s: warm-up sample %d/%d done", self.describe(), index + 1, len(ordered))

    def _activate(self) -> None:
        if self._module is None:
            raise RuntimeError(f"{self.name}: no module to compile (from_dict needs the original module)")
        self._cudagraphs = self.config.wants_cudagraphs and self._device is not None and self._device.type == "cuda"
        self._mark_regions()
        self._compiled = self._compile()
        self._compiled_modes = set()

    def _deactivate(self) -> None:
        self._compiled = None
        self._unmark_regions()

    def _infer(self, *args: Any, **kwargs: Any) -> Any:
        mode = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        if mode not in self._compiled_modes:
            # Grad mode and inference mode are part of dynamo's guards: the first call in a mode the warm-up did
            # not cover (or the first call after activate/deploy) compiles again. Mark its inputs so that this
            # compile is dynamic over the recorded range too: one compile per mode, not one per shape.
            with self._marked(args, kwargs, soft=self._soft_marks), raised_recompile_limit():
                output = self._run(args, kwargs)
            self._compiled_modes.add(mode)  # (once compiled: a call meanwhile must not take the mode for served)
            return output
        return self._run(args, kwargs)

    def serve(self, *args: Any, **kwargs: Any) -> Any:
        """`infer`, without a compile on the caller's thread once its mode has a graph (module docstring)."""
        mode = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        if self._packs:
            args, kwargs = pack(args, kwargs)
        if self._serving is None or mode not in self._compiled_modes or not self.is_active or not self.config.fullgraph:
            return self.infer(*args, **kwargs)
        return served(lambda: self._run(args, kwargs, self._serving))

    # ------------------------------------------------------------------------------ checkpoint
    def _extra_state(self) -> dict[str, Any]:
        return {
            self.STATE_OUTPUT_DTYPES: [str(d) for d in self._output_dtypes],
            self.STATE_DYNAMIC_MARKS: [list(m) for m in self._marks],
            self.STATE_BINDER: self._binder.to_dict() if self._binder is not None else None,
            "soft_marks": self._soft_marks,
            "regions_off": self._regions_off,
        }

    def _load_extra_state(self, module: torch.nn.Module | None, state_dict: dict[str, Any]) -> None:
        if module is None:
            raise ValueError(f"{self.name}.from_dict needs the original module (its weights are saved separately)")
        self._module = module
        self._entry = None
        self._output_dtypes = [dtype_from_str(str(d)) for d in state_dict.get(self.STATE_OUTPUT_DTYPES, [])]
        self._marks = [tuple(int(v) for v in m) for m in state_dict.get(self.STATE_DYNAMIC_MARKS, [])]  # type: ignore[misc]
        self._soft_marks = bool(state_dict.get("soft_marks", False))
        self._regions_off = bool(state_dict.get("regions_off", False))
        binder = state_dict.get(self.STATE_BINDER)
        self._binder = Binder.from_dict(binder) if binder is not None else None
