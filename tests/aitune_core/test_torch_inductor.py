import json

import pytest
import torch
from core_fakes import TinyMLP, record

from aitune_core.backends.backend import BackendState, to_jsonable
from aitune_core.backends.torch_inductor import VALID_MODES, TorchInductorBackend, TorchInductorBackendConfig
from aitune_core.errors import BackendBuildError
from aitune_core.validation.tolerance import default_tolerance
from aitune_core.validation.validator import validate_backend


# ------------------------------------------------------------------------- config
def test_mode_and_options_are_exclusive():
    with pytest.raises(ValueError, match="both 'mode' and 'options'"):
        TorchInductorBackendConfig(mode="max-autotune", options={"max_autotune": True})


def test_unknown_mode_lists_valid_modes():
    with pytest.raises(ValueError) as info:
        TorchInductorBackendConfig(mode="fastest")
    for mode in VALID_MODES:
        assert mode in str(info.value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int8, "float64", 3])
def test_autocast_dtype_must_be_half_or_bfloat16(dtype):
    with pytest.raises(ValueError, match="autocast_dtype"):
        TorchInductorBackendConfig(autocast_enabled=True, autocast_dtype=dtype)


def test_autocast_dtype_accepts_strings_from_json():
    config = TorchInductorBackendConfig(autocast_enabled=True, autocast_dtype="torch.bfloat16")
    assert config.autocast_dtype is torch.bfloat16
    dumped = json.loads(json.dumps(to_jsonable(config.to_dict())))
    assert TorchInductorBackendConfig.from_dict(dumped) == config


def test_describe_matches_the_seed():
    backend = TorchInductorBackend(TorchInductorBackendConfig(autocast_enabled=True, autocast_dtype=torch.float16))
    assert backend.describe() == "TorchInductorBackend(autocast_enabled=True,autocast_dtype=torch.float16)"
    assert TorchInductorBackend().describe() == "TorchInductorBackend()"
    assert (
        TorchInductorBackendConfig(mode="max-autotune", fullgraph=True).describe()
        == "fullgraph=True,mode='max-autotune'"
    )


def test_cudagraph_detection():
    assert TorchInductorBackendConfig(mode="reduce-overhead").wants_cudagraphs
    assert TorchInductorBackendConfig(mode="max-autotune").wants_cudagraphs
    assert not TorchInductorBackendConfig(mode="max-autotune-no-cudagraphs").wants_cudagraphs
    assert TorchInductorBackendConfig(options={"triton.cudagraphs": True}).wants_cudagraphs
    assert not TorchInductorBackendConfig().wants_cudagraphs


def test_autocast_widens_float_tolerance():
    backend = TorchInductorBackend(TorchInductorBackendConfig(autocast_enabled=True, autocast_dtype=torch.float16))
    assert backend.tolerance(torch.float32) == default_tolerance(torch.float16)
    assert backend.tolerance(torch.int64).exact
    assert TorchInductorBackend().tolerance(torch.float32) == default_tolerance(torch.float32)


def test_fullgraph_graph_break_fails_the_build(tmp_path):
    class Breaks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            if x.sum().item() > 0:  # data-dependent branch: a graph break
                return self.fc(x)
            return -self.fc(x)

    model = Breaks().eval()
    spec, data = record(model)
    backend = TorchInductorBackend(TorchInductorBackendConfig(fullgraph=True))
    with pytest.raises(BackendBuildError, match="TorchInductorBackend"):
        backend.build(model, spec, data, torch.device("cpu"), tmp_path)
    assert backend.state is BackendState.INIT


def test_checkpoint_needs_the_module():
    state = {"type": "TorchInductorBackend", "config": TorchInductorBackendConfig().to_dict(), "device": "cpu"}
    with pytest.raises(ValueError, match="original module"):
        TorchInductorBackend.from_dict(None, state)


# ------------------------------------------------------------------------- the one real compile
def _unique_graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def _cache_entries(code) -> int:
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    return len(_debug_get_cache_entry_list(code))


@pytest.mark.slow
def test_inductor_on_cpu_does_not_recompile_inside_the_recorded_range(tmp_path):
    model = TinyMLP().eval()
    spec, data = record(model, batch_sizes=(1, 8))  # batch 1 is specialized by dynamo; 2..8 share one graph
    assert spec.input_spec.tensors[0].shape[0] == "batch0"
    # the user's own compile of another instance, with the same settings: its entries live on TinyMLP.forward
    users = torch.compile(TinyMLP().eval())
    with torch.no_grad():
        users(torch.randn(8, 8))
    forward_code = TinyMLP.forward.__code__
    users_entries = _cache_entries(forward_code)
    assert users_entries >= 1

    backend = TorchInductorBackend().build(model, spec, data, torch.device("cpu"), tmp_path)
    validate_backend(backend, spec, data)
    # the backend compiled its own entry: it neither used nor added to the entries on the class's forward
    assert _cache_entries(forward_code) == users_entries
    assert _cache_entries(backend._entry.__code__) >= 1
    compiled_graphs = _unique_graphs()
    with torch.no_grad():
        for batch in (4, 3, 8, 1):
            x = torch.randn(batch, 8)
            torch.testing.assert_close(backend.infer(x), model(x), rtol=1e-4, atol=1e-5)
    assert _unique_graphs() == compiled_graphs, "a batch size inside the recorded range recompiled"

    # inference mode is a different dynamo guard: one more (dynamic) compile, then no more
    with torch.inference_mode():
        for batch in (4, 6, 3):
            x = torch.randn(batch, 8)
            torch.testing.assert_close(backend.infer(x), model(x), rtol=1e-4, atol=1e-5)
    assert _unique_graphs() <= compiled_graphs + 1

    # checkpoint round trip: config + output dtypes + marks; the module comes from the caller
    state = json.loads(json.dumps(to_jsonable(backend.to_dict())))
    backend.deactivate()
    assert backend._compiled is None
    loaded = TorchInductorBackend.from_dict(model, state)
    loaded.deploy("cpu")
    with torch.no_grad():
        for batch in (5, 2):
            x = torch.randn(batch, 8)
            torch.testing.assert_close(loaded.infer(x), model(x), rtol=1e-4, atol=1e-5)


class _KeywordModel(torch.nn.Module):
    """Called the way transformers models are: by keyword, with a sequence axis that varies."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 8)
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.lin(self.emb(input_ids)) * attention_mask.unsqueeze(-1)
        return hidden.sum(dim=1)


def test_a_keyword_call_is_warmed_up_by_keyword_and_not_compiled_again(tmp_path):
    # the warm-up marked its dynamic axes on a call re-made by position; dynamo guards on the call's form, so
    # validation and every served call (by keyword) compiled twice more (a BERT-base on an H200: not tuned in 90 s)
    from aitune_core.recording.graph_recorder import GraphRecorder

    model = _KeywordModel().eval()
    recorder = GraphRecorder(model)
    generator = torch.Generator().manual_seed(0)

    def call(length: int) -> dict:
        return {"input_ids": torch.randint(0, 50, (4, length), generator=generator),
                "attention_mask": torch.ones(4, length)}

    with torch.no_grad():
        for length in (12, 30, 21):
            kwargs = call(length)
            recorder.record((), kwargs, model(**kwargs))
    spec = recorder.graph_specs[0]
    data = recorder.samples(spec)
    assert spec.input_spec.tensors[0].max_shape[1] > spec.input_spec.tensors[0].min_shape[1]  # a varying axis
    graphs = _unique_graphs()
    backend = TorchInductorBackend().build(model, spec, data, torch.device("cpu"), tmp_path)
    assert _unique_graphs() == graphs + 1
    validate_backend(backend, spec, data)
    with torch.no_grad():
        for length in (14, 29, 12):
            kwargs = call(length)
            torch.testing.assert_close(backend.infer(**kwargs), model(**kwargs), rtol=1e-4, atol=1e-5)
    assert _unique_graphs() == graphs + 1, "validation or a served keyword call compiled again"


# ------------------------------------------------------------------------- inference paths without compiling
def _runtime_only(config, compiled, output_dtypes, device="cpu"):
    """A backend whose `_compiled` is a plain callable: exercises `_run` without paying for a compile."""
    backend = TorchInductorBackend(config)
    backend._device = torch.device(device)
    backend._compiled = compiled
    backend._output_dtypes = output_dtypes
    return backend


def test_autocast_runs_in_low_precision_and_restores_output_dtypes():
    model = TinyMLP().eval()
    seen = []

    def compiled(x):
        out = model(x)
        seen.append(out.dtype)
        return {"out": out, "ids": out.argmax(-1)}

    config = TorchInductorBackendConfig(autocast_enabled=True, autocast_dtype=torch.bfloat16)
    backend = _runtime_only(config, compiled, [torch.float32, torch.int64])
    x = torch.randn(3, 8)
    with torch.no_grad():
        out = backend._run((x,), {})
    assert seen == [torch.bfloat16]
    assert out["out"].dtype == torch.float32 and out["ids"].dtype == torch.int64
    torch.testing.assert_close(out["out"], model(x), rtol=5e-2, atol=5e-2)


def test_cudagraph_outputs_are_cloned_without_mark_steps(monkeypatch):
    def no_mark_steps():  # a mark step would switch the user's CUDA-graph functions to mark-step generations
        raise AssertionError("the backend called cudagraph_mark_step_begin")

    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", no_mark_steps)
    buffer = torch.zeros(2, 2)

    def compiled(x):  # like a CUDA graph replay: always the same output storage
        buffer.copy_(x)
        return (buffer,)

    backend = _runtime_only(TorchInductorBackendConfig(mode="reduce-overhead"), compiled, [torch.float32])
    backend._cudagraphs = True
    first = backend._run((torch.ones(2, 2),), {})[0]
    backend._run((torch.full((2, 2), 7.0),), {})
    assert torch.equal(first, torch.ones(2, 2))


def test_autocast_cudagraph_outputs_are_owned_with_one_copy_each(monkeypatch):
    low = torch.zeros(2, 2, dtype=torch.bfloat16)  # graph buffers: a bf16 output cast back, an int64 one kept
    ids = torch.zeros(2, dtype=torch.int64)

    def compiled(x):
        low.copy_(x)
        ids.copy_(x[:, 0].long())
        return {"out": low, "ids": ids}

    clones = []
    original_clone = torch.Tensor.clone

    def counting_clone(self, *args, **kwargs):
        clones.append(self.dtype)
        return original_clone(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "clone", counting_clone)
    config = TorchInductorBackendConfig(mode="reduce-overhead", autocast_enabled=True, autocast_dtype=torch.bfloat16)
    backend = _runtime_only(config, compiled, [torch.float32, torch.int64])
    backend._cudagraphs = True
    first = backend._run((torch.ones(2, 2),), {})
    backend._run((torch.full((2, 2), 7.0),), {})
    assert first["out"].dtype == torch.float32 and torch.equal(first["out"], torch.ones(2, 2))
    assert torch.equal(first["ids"], torch.ones(2, dtype=torch.int64))  # not overwritten by the second call
    assert clones == [torch.int64, torch.int64]  # the cast output was not cloned on top of its cast


@pytest.mark.parametrize("cudagraphs", [False, True], ids=["plain", "cudagraphs"])
def test_a_bare_tensor_output_is_cast_back_or_owned_without_a_tree_walk(monkeypatch, cudagraphs):
    """The single-tensor fast path gives the same answers as the general one: a low-precision float output is
    cast back (that copy is the caller's), an output already in its dtype is cloned only under CUDA graphs."""
    import aitune_core.backends.torch_inductor as module

    def no_walk(value):
        raise AssertionError("a bare tensor output went through the pytree walk")

    monkeypatch.setattr(module, "flatten_values", no_walk)
    graph_buffer = torch.zeros(2, 3, dtype=torch.bfloat16)
    config = TorchInductorBackendConfig(mode="reduce-overhead" if cudagraphs else None, autocast_enabled=True,
                                        autocast_dtype=torch.bfloat16)
    backend = _runtime_only(config, lambda x: graph_buffer.copy_(x), [torch.float32])
    backend._cudagraphs = cudagraphs
    first = backend._run((torch.ones(2, 3),), {})
    backend._run((torch.full((2, 3), 5.0),), {})
    assert first.dtype == torch.float32 and torch.equal(first, torch.ones(2, 3))

    same_dtype = torch.ones(2, 3)  # e.g. an output that autocast left in float32
    backend = _runtime_only(config, lambda x: same_dtype, [torch.float32])
    backend._cudagraphs = cudagraphs
    out = backend._run((torch.ones(2, 3),), {})
    assert (out is same_dtype) is not cudagraphs and torch.equal(out, same_dtype)


# ------------------------------------------------------------------------- GPU (run by the lead on the GPU machine)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@pytest.mark.slow
@needs_cuda
@pytest.mark.parametrize(
    "config",
    [
        TorchInductorBackendConfig(mode="reduce-overhead"),
        TorchInductorBackendConfig(mode="max-autotune-no-cudagraphs", autocast_enabled=True,
                                   autocast_dtype=torch.float16),
    ],
    ids=["reduce-overhead", "autocast-fp16"],
)
def test_inductor_on_cuda(config, tmp_path):
    model = TinyMLP().eval().cuda()
    spec, data = record(model.cpu(), batch_sizes=(2, 8))
    model.cuda()
    backend = TorchInductorBackend(config).build(model, spec, data, torch.device("cuda"), tmp_path)
    validate_backend(backend, spec, data)
    compiled_graphs = _unique_graphs()
    with torch.no_grad():
        xs = [torch.randn(b, 8, device="cuda") for b in (4, 4, 6)]
        outs = [backend.infer(x) for x in xs]  # kept across calls: must not be overwritten by later replays
        for x, out in zip(xs, outs):
            torch.testing.assert_close(out, model(x), rtol=2e-2, atol=2e-2)
            assert out.dtype == torch.float32
    assert _unique_graphs() == compiled_graphs


@pytest.mark.gpu
@pytest.mark.slow
@needs_cuda
def test_cuda_graph_backend_leaves_the_users_cuda_graph_functions_alone(tmp_path):
    """Beside a user's own reduce-overhead compile of another instance of the same class: the backend compiles
    its own graph, never switches CUDA-graph trees to mark-step generations, and the user's function keeps
    replaying (holding its last output across calls, as user code does) instead of re-recording.

    Both functions live in one CUDA-graph tree, so the first alternations record each one once more as the
    other's child (on an H200 with torch 2.11: 2 recordings); what must not happen is a recording per call,
    as when the two shared compiled code (2028 re-recordings in one benchmark run before the fix)."""
    from torch._dynamo.utils import counters
    from torch._inductor import cudagraph_trees

    model = TinyMLP().eval()
    users = torch.compile(TinyMLP().eval().cuda(), mode="reduce-overhead")
    spec, data = record(model, batch_sizes=(4,))
    model.cuda()
    x = torch.randn(4, 8, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            users(x)  # warm-up and recording of the user's graph
        backend = TorchInductorBackend(TorchInductorBackendConfig(mode="reduce-overhead")).build(
            model, spec, data, torch.device("cuda"), tmp_path)
        before = counters["inductor"]["cudagraph_recorded_non_static_inputs"]
        held = users(x)
        for _ in range(3):  # settle: each function recorded once in the other's place in the tree
            ours = backend.infer(x)
            held = users(x)
        settled = counters["inductor"]["cudagraph_recorded_non_static_inputs"]
        for _ in range(20):
            ours = backend.infer(x)
            held = users(x)
    assert cudagraph_trees.MarkStepBox.mark_step_counter == 0
    torch.testing.assert_close(ours, model(x), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(held, users._orig_mod(x), rtol=1e-3, atol=1e-3)
    assert settled - before <= 2, f"{settled - before} recordings while settling"
    assert counters["inductor"]["cudagraph_recorded_non_static_inputs"] == settled, "graphs recorded on every call"


class _Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return x + torch.relu(self.fc(x))


def test_repeated_blocks_are_marked_while_the_backend_is_active(tmp_path, monkeypatch):
    import gc

    from aitune_core.backends import compile_regions

    model = torch.nn.Sequential(*(_Layer() for _ in range(compile_regions.MIN_REPEATS))).eval()
    original = _Layer.__dict__["forward"]
    spec, data = record(model)
    seen = []
    warm_up = TorchInductorBackend._warm_up

    def watching(self, ordered, graph_spec):
        seen.append(_Layer.__dict__["forward"] is not original)
        return warm_up(self, ordered, graph_spec)

    monkeypatch.setattr(TorchInductorBackend, "_warm_up", watching)
    backend = TorchInductorBackend()
    backend.build(model, spec, data, torch.device("cpu"), tmp_path)
    marked = _Layer.__dict__["forward"]
    assert seen == [True] and marked is not original  # held while the compiled graph serves
    assert backend.regions_summary == f"{compile_regions.MIN_REPEATS} _Layer blocks in 1 group"  # for the history
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(backend.infer(x), model(x))
    backend.deactivate()
    assert _Layer.__dict__["forward"] is original
    backend.activate()
    assert _Layer.__dict__["forward"] is marked  # the same object: graphs that guard on it keep matching
    del backend
    gc.collect()  # a backend dropped without deactivation gives its hold back when it is garbage
    assert _Layer.__dict__["forward"] is original and not compile_regions._held
    plain = TorchInductorBackend(TorchInductorBackendConfig(regions=False))
    seen.clear()
    plain.build(model, spec, data, torch.device("cpu"), tmp_path)
    assert seen == [False] and plain.regions_summary is None


def test_a_compile_that_fails_with_regions_is_retried_without_and_remembers_it(tmp_path, monkeypatch):
    from aitune_core.backends.compile_regions import MIN_REPEATS

    model = torch.nn.Sequential(*(_Layer() for _ in range(MIN_REPEATS))).eval()
    spec, data = record(model)
    warm_up = TorchInductorBackend._warm_up
    calls = []

    def failing_with_regions(self, ordered, graph_spec):
        calls.append(self._regions_off)
        if not self._regions_off:
            raise RuntimeError("exceeded maximum reuse entries of invoke_subgraph")
        return warm_up(self, ordered, graph_spec)

    monkeypatch.setattr(TorchInductorBackend, "_warm_up", failing_with_regions)
    backend = TorchInductorBackend()
    backend.build(model, spec, data, torch.device("cpu"), tmp_path)
    assert calls == [False, True] and backend.to_dict()["regions_off"] is True

    def failing_otherwise(self, ordered, graph_spec):
        raise RuntimeError("a model error")

    monkeypatch.setattr(TorchInductorBackend, "_warm_up", failing_otherwise)
    with pytest.raises(BackendBuildError, match="a model error"):  # not a region's fault: no second compile
        TorchInductorBackend().build(model, spec, data, torch.device("cpu"), tmp_path)
    assert _Layer.__dict__["forward"].__name__ == "forward" and not hasattr(_Layer.forward, "__aitune_region__")


def test_cuda_graph_modes_refuse_a_graph_whose_sequence_length_varies(tmp_path):
    from aitune_core.backends.torch_inductor import _varying_sequence_axis
    from aitune_core.recording.graph_recorder import GraphRecorder

    model = _Layer().eval()
    recorder = GraphRecorder(model)
    with torch.no_grad():
        for length in (5, 9):
            x = torch.randn(2, length, 8)
            recorder.record((x,), {}, model(x), batch_size=2)
    spec = recorder.graph_specs[0]
    assert "5..9" in _varying_sequence_axis(spec)
    backend = TorchInductorBackend(TorchInductorBackendConfig(mode="reduce-overhead"))
    with pytest.raises(BackendBuildError, match="CUDA graphs record one graph per size"):
        backend.build(model, spec, recorder.samples(spec), torch.device("cuda"), tmp_path)
    batch_only, _data = record(TinyMLP().eval())  # batch sizes vary, nothing else: CUDA graphs stay a candidate
    assert _varying_sequence_axis(batch_only) is None


def test_cuda_graph_modes_refuse_a_module_that_changes_its_arguments(tmp_path):
    from aitune_core.recording.graph_recorder import GraphRecorder
    from aitune_core.recording.sample import owned_inputs

    class Appends(torch.nn.Module):
        def forward(self, x, cache):
            cache["keys"] = torch.cat([cache["keys"], x], dim=1)
            return cache["keys"].sum(1)

    model = Appends()
    recorder = GraphRecorder(model)
    cache = {"keys": torch.zeros(2, 1)}
    for _ in range(2):
        x = torch.randn(2, 1)
        before = owned_inputs((x, cache), {})
        recorder.record(*before, model(x, cache), after=((x, cache), {}))
    spec = recorder.graph_specs[0]
    backend = TorchInductorBackend(TorchInductorBackendConfig(mode="reduce-overhead"))
    with pytest.raises(BackendBuildError, match="calls change their arguments"):
        backend.build(model, spec, recorder.samples(spec), torch.device("cuda"), tmp_path)


@pytest.mark.slow
def test_a_graph_the_program_calls_under_inference_mode_is_compiled_for_it_in_the_build(tmp_path):
    """Its first call under `torch.inference_mode()` (sentence-transformers' `encode()`) compiled inside the
    request: dynamo guards the mode, and the warm-up ran under no_grad only."""
    import dataclasses

    from torch._dynamo.utils import counters

    model = TinyMLP().eval()
    spec, data = record(model)
    spec = dataclasses.replace(spec, inference_mode=True)
    backend = TorchInductorBackend(TorchInductorBackendConfig(fullgraph=True)).build(
        model, spec, data, torch.device("cpu"), tmp_path)
    graphs = counters["stats"]["unique_graphs"]
    x = torch.randn(3, 8)
    with torch.inference_mode():
        torch.testing.assert_close(backend.serve(x), model(x))
    assert counters["stats"]["unique_graphs"] == graphs


