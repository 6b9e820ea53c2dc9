import pytest
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

from aitune_core.backends.isolated_entry import isolated_entry
from aitune_core.backends.scalar_specialization import ScalarSpecialization
from aitune_core.backends.torch_inductor import TorchInductorBackend, TorchInductorBackendConfig
from aitune_core.errors import BackendBuildError
from aitune_core.recording.graph_recorder import GraphRecorder
from aitune_core.validation.validator import validate_backend


class Stepped(torch.nn.Module):
    """The step's value is arithmetic: dynamo's second compile makes it symbolic."""

    def forward(self, x, t):
        return x * t + torch.sin(x) * (t // 2)


class Indexed(torch.nn.Module):
    """The step indexes a Python list: every value is a trace of its own."""

    scales = (0.5, 1.0, 1.5, 2.0, 2.5)

    def forward(self, x, t):
        return x * self.scales[t]


def _warm_up(module, steps):
    recorder = GraphRecorder(module)
    for t in steps:
        x = torch.randn(2, 3)
        recorder.record((x, t), {}, module(x, t))
    spec = recorder.graph_specs[0]
    assert spec.free_scalars() == ["t"]
    entry = isolated_entry(module)
    compiled = torch.compile(entry, backend="eager", fullgraph=True)
    watch = ScalarSpecialization(spec, entry)
    for sample in recorder.samples(spec):
        with watch.call(tuple(sample.args), dict(sample.kwargs)):
            compiled(*sample.args, **sample.kwargs)
    return compiled


def test_a_symbolic_step_passes_and_serves_new_values_without_compiling():
    compiled = _warm_up(Stepped(), (4, 3, 2, 1))
    with torch.compiler.set_stance("fail_on_recompile"):
        x = torch.randn(2, 3)
        torch.testing.assert_close(compiled(x, 7), Stepped()(x, 7))


def test_a_step_the_trace_specializes_on_fails_the_build_on_its_third_value():
    with pytest.raises(BackendBuildError, match="specializes on the value of t"):
        _warm_up(Indexed(), (0, 1, 2, 3))


def test_two_values_are_not_judged():
    _warm_up(Indexed(), (0, 1, 0, 1))


class _Denoiser(torch.nn.Module):
    """A hand-written diffusion step: the timestep is a Python int that changes on every call."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8 + 4, 8)

    def forward(self, x: torch.Tensor, t: int) -> torch.Tensor:
        freqs = torch.arange(1, 3, dtype=torch.float32) / 1000
        emb = torch.cat([torch.sin(t * freqs), torch.cos(t * freqs)]).expand(x.shape[0], 4)
        return self.lin(torch.cat([x, emb], -1))


def test_a_free_int_step_compiles_twice_and_serves_every_later_step_compiled(tmp_path):
    """Before free scalars each step was a graph and a compile of its own (20 for a 20-step loop)."""
    model = _Denoiser().eval()
    recorder = GraphRecorder(model)
    with torch.no_grad():
        for t in (999, 949, 899, 849):
            x = torch.randn(2, 8)
            recorder.record((x, t), {}, model(x, t))
    spec = recorder.graph_specs[0]
    assert len(recorder.graph_specs) == 1 and spec.free_scalars() == ["t"]
    data = recorder.samples(spec)
    backend = TorchInductorBackend(TorchInductorBackendConfig(fullgraph=True)).build(
        model, spec, data, torch.device("cpu"), tmp_path)
    validate_backend(backend, spec, data)
    assert len(_debug_get_cache_entry_list(backend._entry.__code__)) == 2  # the constant, then the symbol
    with torch.no_grad():
        for t in (799, 1, 0, 500):
            x = torch.randn(2, 8)
            torch.testing.assert_close(backend.serve(x, t), model(x, t))  # a miss would raise CompiledCodeMissed
    assert len(_debug_get_cache_entry_list(backend._entry.__code__)) == 2


def test_cuda_graph_modes_refuse_a_graph_with_a_free_scalar(tmp_path):
    """A recording per value, and on an H100 the first recording on the serving thread failed (background mode)."""
    model = _Denoiser().eval()
    recorder = GraphRecorder(model)
    with torch.no_grad():
        for t in (999, 949):
            x = torch.randn(2, 8)
            recorder.record((x, t), {}, model(x, t))
    spec = recorder.graph_specs[0]
    backend = TorchInductorBackend(TorchInductorBackendConfig(mode="reduce-overhead"))
    with pytest.raises(BackendBuildError, match="CUDA graphs record one graph per value of t"):
        backend.build(model, spec, recorder.samples(spec), torch.device("cuda"), tmp_path)
