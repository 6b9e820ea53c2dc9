"""JIT: a tuned module follows the model (weights, structure, mode, hooks) with every CPU backend (issue 17)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "aitune_core"))  # follow_scenarios

from follow_scenarios import CHANGES, SWAPS, bert_block, eager_twin, make_net, run_scenarios, swap_projections

from aitune_core.backends.onnxruntime import ONNXRuntimeBackend
from aitune_core.backends.torch_eager import TorchEagerBackend
from aitune_core.backends.torch_inductor import TorchInductorBackend
from aitune_core.strategies.one_backend import OneBackendStrategy
from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.runtime import bypassed
from aitune_jit.state import NodeState
from aitune_jit.summary import summary_lines
from aitune_jit.switch import enable


def _onnxruntime() -> ONNXRuntimeBackend:
    """The ONNX Runtime backend; its tests skip where the onnx extra is not installed."""
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    return ONNXRuntimeBackend()


def _torchao():
    quantization = pytest.importorskip("torchao.quantization")
    from aitune_core.backends.torchao import TorchAOBackend, TorchAOBackendConfig

    return TorchAOBackend(TorchAOBackendConfig(quantization_config=quantization.Int8WeightOnlyConfig(), compile=False))


BACKENDS = {
    "eager": (TorchEagerBackend, 1e-5),
    "onnxruntime": (_onnxruntime, 1e-4),
    "torchao": (_torchao, 0.1),
    "inductor": (TorchInductorBackend, 1e-4),
}


def _eager_run(fn):
    with bypassed():
        return fn()


@pytest.mark.parametrize(
    "backend_name", ["eager", "onnxruntime", "torchao", pytest.param("inductor", marks=pytest.mark.slow)]
)
def test_tuned_module_follows_every_change(backend_name, tmp_path):
    make_backend, tolerance = BACKENDS[backend_name]
    jit_config.min_parameters = 0
    jit_config.cache_dir = tmp_path
    jit_config.strategy = OneBackendStrategy(make_backend())
    net = make_net()
    eager = eager_twin(net)
    enable()
    x = torch.randn(4, 8)
    with torch.no_grad():
        for _ in range(3):
            net(x)
    node = PatchedModule.of(net)
    assert node is not None and node.state is NodeState.TUNED, PatchedModule.history

    def serving() -> bool:
        dispatcher = node.dispatcher
        return dispatcher is not None and not dispatcher.watch.stale()

    done = run_scenarios(net, net, eager, run_eager=_eager_run, serving=serving, atol=tolerance, rtol=tolerance)
    assert len(done) == len(CHANGES) + 6


def _count_calls(module: torch.nn.Module, counts: list[str]) -> None:
    module.register_forward_hook(lambda *a: counts.append("hook"))


def test_child_hooks_fire_once_per_call_while_recording_tuning_and_after():
    from jit_helpers import CountingBackend, make_mlp

    jit_config.min_parameters = 0
    jit_config.strategy = OneBackendStrategy(CountingBackend())  # runs the module: a probe would fire hooks
    net = make_mlp()
    eager = eager_twin(net)
    hooked = net.blocks[0].fc
    counts: list[str] = []
    _count_calls(hooked, counts)
    enable()
    x = torch.randn(3, 32)
    with torch.no_grad():
        for calls in range(1, 9):
            torch.testing.assert_close(net(x), _eager_run(lambda: eager(x)))
            assert len(counts) == calls, (calls, counts, PatchedModule.history)
    states = {node.path: node.state for node in PatchedModule.walk()}
    # the hooked subtree is not tuned as a whole; the rest is
    assert states["MLP"] is NodeState.EAGER and states["MLP.blocks.0"] is NodeState.EAGER
    assert states["MLP.blocks.1"] is NodeState.TUNED and states["MLP.blocks.0.norm"] is NodeState.TUNED
    assert CountingBackend.builds >= 2


def test_a_hook_added_after_tuning_fires_once_per_call_and_detaches_cleanly():
    from jit_helpers import CountingBackend, make_mlp

    jit_config.min_parameters = 0
    jit_config.strategy = OneBackendStrategy(CountingBackend())
    net = make_mlp()
    enable()
    x = torch.randn(3, 32)
    with torch.no_grad():
        for _ in range(3):
            net(x)
        assert PatchedModule.of(net).state is NodeState.TUNED
        counts: list[str] = []
        handle = net.blocks[1].fc.register_forward_hook(lambda *a: counts.append("hook"))
        infers = CountingBackend.infers
        for calls in range(1, 4):
            net(x)
            assert len(counts) == calls
        assert CountingBackend.infers == infers  # the original module answered
        handle.remove()
        net(x)
        assert len(counts) == 3 and CountingBackend.infers == infers + 1  # the backend serves again


def test_jit_tuned_block_matches_eager_across_twenty_swaps(tmp_path):
    """The LoRA-like swaps of tests/aitune_aot/test_aot_weight_swap.py through the JIT (TorchAO: each refit is a
    re-quantization of a fresh copy)."""
    pytest.importorskip("transformers")
    block = bert_block()
    twin = eager_twin(block)
    jit_config.min_parameters = 0
    jit_config.cache_dir = tmp_path
    jit_config.strategy = OneBackendStrategy(_torchao())
    enable()
    x = torch.randn(2, 6, 32)
    with torch.no_grad():
        for _ in range(3):
            block(x)
        node = PatchedModule.of(block)
        assert node is not None and node.state is NodeState.TUNED, PatchedModule.history
        for step in range(SWAPS):
            swap_projections(block, twin, step)
            for _ in range(2):
                with bypassed():
                    want = twin(x)
                torch.testing.assert_close(block(x), want, atol=0.1, rtol=0.1,
                                           msg=lambda m, step=step: f"swap {step}: {m}")
            assert not node.dispatcher.watch.stale()


def test_the_torch_patches_come_off_with_the_jit():
    import gc

    from jit_helpers import CountingBackend, make_mlp

    from aitune_core.backends import module_epoch
    from aitune_jit.switch import disable

    gc.collect()  # watches of earlier tests
    original = torch.nn.Module.__dict__["__setattr__"]
    jit_config.min_parameters = 0
    jit_config.strategy = OneBackendStrategy(CountingBackend())
    net = make_mlp()
    enable()
    with torch.no_grad():
        for _ in range(3):
            net(torch.randn(3, 32))
    assert PatchedModule.of(net).state is NodeState.TUNED and module_epoch.installed()
    disable()
    assert not module_epoch.installed()  # no garbage collection needed
    assert torch.nn.Module.__dict__["__setattr__"] is original


class _Embedder(torch.nn.Module):
    """Token ids in, vectors out: the input's dtype stays when the module is cast, so calls keep matching the graph
    tuned before (a float input cast along would be another graph)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(50, 32)
        self.fc = torch.nn.Linear(32, 32)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(self.embed(ids)).relu()


def _embedder_tuned_with_counting_backend() -> tuple[torch.nn.Module, torch.Tensor]:
    """An `_Embedder` tuned (blocking) with `CountingBackend`, and the input it was called with."""
    from jit_helpers import CountingBackend

    jit_config.min_parameters = 0
    jit_config.strategy = OneBackendStrategy(CountingBackend())
    net = _Embedder().eval()
    enable()
    x = torch.randint(0, 50, (3, 7))
    with torch.no_grad():
        for _ in range(3):
            net(x)
    assert PatchedModule.of(net).state is NodeState.TUNED
    return net, x


def _calls_until_tuned(net: torch.nn.Module, node: PatchedModule, x: torch.Tensor, eager: torch.nn.Module) -> None:
    """Call `net` (checking each answer against `eager`) until its node is TUNED again (blocking mode)."""
    for _ in range(10):
        if node.state is NodeState.TUNED:
            return
        torch.testing.assert_close(net(x), _eager_run(lambda: eager(x)))
    raise AssertionError(f"not tuned again: {node.state}; {PatchedModule.history[-5:]}")


def test_a_tuned_module_cast_to_another_dtype_is_recorded_anew_and_tuned_at_it():
    """`.double()` after tuning: the backends made for float32 stop serving at once (the original module answers the
    very next call), the node records the new structure and is tuned at it; casting back does the same again."""
    from jit_helpers import CountingBackend

    jit_config.min_parameters = 0
    jit_config.strategy = OneBackendStrategy(CountingBackend())
    net = _Embedder().eval()
    eager = eager_twin(net)
    enable()
    x = torch.randint(0, 50, (3, 7))
    with torch.no_grad():
        for _ in range(3):
            net(x)
        node = PatchedModule.of(net)
        assert node.state is NodeState.TUNED
        for dtype in (torch.float64, torch.float32):
            net.to(dtype)
            eager.to(dtype)
            infers, builds = CountingBackend.infers, CountingBackend.builds
            assert torch.equal(net(x), _eager_run(lambda: eager(x)))
            assert CountingBackend.infers == infers and node.state is NodeState.RECORDING
            assert any("its dtypes changed" in line for line in PatchedModule.history), PatchedModule.history[-3:]
            _calls_until_tuned(net, node, x, eager)
            assert CountingBackend.builds == builds + 1
            assert net(x).dtype is dtype
            assert CountingBackend.infers > infers and not node.dispatcher.watch.stale()  # serving at the new dtype


def test_a_submodule_forward_replaced_after_tuning_is_answered_by_the_original_until_it_is_put_back():
    """accelerate's `add_hook_to_module` (and a monkeypatch) set an instance `forward` on a child; the tuned graph
    knew nothing of it, and Inductor recompiled it inside the call (a forward drawing random numbers then drew
    them from Inductor's generator: every later answer and the program's own stream differed)."""
    import types

    from jit_helpers import CountingBackend

    net, x = _embedder_tuned_with_counting_backend()
    with torch.no_grad():
        net.fc.forward = types.MethodType(lambda self, h: torch.nn.Linear.forward(self, h) * 3, net.fc)
        infers = CountingBackend.infers
        expected = (torch.nn.Linear.forward(net.fc, net.embed(x)) * 3).relu()
        assert torch.equal(net(x), expected) and CountingBackend.infers == infers  # the original answered
        del net.fc.forward
        assert torch.equal(net(x), net.fc(net.embed(x)).relu()) and CountingBackend.infers == infers + 1


@pytest.mark.slow
def test_an_inductor_module_cast_to_another_dtype_is_never_compiled_on_the_callers_call(tmp_path):
    """Inductor's dynamo guards would recompile for the new dtype inside the caller's call (4.9 s for a small BERT
    on this CPU), and nothing would validate that graph: the original module answers instead until the node is
    tuned again (here in blocking mode, by the call that completes its samples)."""
    from torch._dynamo.utils import counters

    jit_config.min_parameters = 0
    jit_config.cache_dir = tmp_path
    jit_config.strategy = OneBackendStrategy(TorchInductorBackend())
    net = _Embedder().eval()
    eager = eager_twin(net)
    enable()
    x = torch.randint(0, 50, (3, 7))
    with torch.no_grad():
        for _ in range(3):
            net(x)
        node = PatchedModule.of(net)
        assert node.state is NodeState.TUNED, PatchedModule.history
        net.double()
        eager.double()
        graphs = counters["stats"]["unique_graphs"]
        assert torch.equal(net(x), _eager_run(lambda: eager(x)))
        assert counters["stats"]["unique_graphs"] == graphs  # no compile inside that call
        assert node.state is NodeState.RECORDING
        _calls_until_tuned(net, node, x, eager)
        assert counters["stats"]["unique_graphs"] > graphs  # (the counter sees the re-tuning's compile)
        torch.testing.assert_close(net(x), _eager_run(lambda: eager(x)))
        assert net(x).dtype is torch.float64 and not node.dispatcher.watch.stale()


def _tune_with_whole_graph_inductor(tmp_path: Path) -> None:
    """One Inductor candidate compiled as one graph, as the JIT's own Inductor candidates compile (a backend with
    graph breaks compiles in the call)."""
    from aitune_core.backends.torch_inductor import TorchInductorBackendConfig

    jit_config.min_parameters = 0
    jit_config.cache_dir = tmp_path
    jit_config.strategy = OneBackendStrategy(TorchInductorBackend(TorchInductorBackendConfig(fullgraph=True)))


class _Scaled(_Embedder):
    """An `_Embedder` whose output scale is a plain attribute: dynamo guards the value its trace read."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = 1.0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return super().forward(ids) * self.scale


@pytest.mark.slow
def test_when_a_compiled_graphs_guards_fail_the_original_answers_and_the_module_is_tuned_again(tmp_path):
    """A plain attribute the trace read changes (`unet.enable_freeu(...)`, `vae.enable_tiling()`): dynamo would
    recompile inside the caller's call. The backend serves in run-only mode: its calls are answered by the plain
    forward, without a compile; after `retune_after_misses` of them the graph is tuned again, finds its recorded
    calls stale, and the node records anew and is tuned as the module is now (blocking mode here)."""
    from torch._dynamo.utils import counters

    _tune_with_whole_graph_inductor(tmp_path)
    net = _Scaled().eval()
    eager = eager_twin(net)
    enable()
    x = torch.randint(0, 50, (3, 7))
    with torch.no_grad():
        for _ in range(3):
            net(x)
        node = PatchedModule.of(net)
        assert node.state is NodeState.TUNED, PatchedModule.history
        net.scale = eager.scale = 3.0
        graphs = counters["stats"]["unique_graphs"]
        for _ in range(jit_config.retune_after_misses - 1):
            assert torch.equal(net(x), _eager_run(lambda: eager(x)))
        assert counters["stats"]["unique_graphs"] == graphs  # none of those calls compiled
        assert node.state is NodeState.TUNED and node.dispatcher.code_misses == jit_config.retune_after_misses - 1
        assert node.missed_code == jit_config.retune_after_misses - 1 and node.fallbacks == 0  # (not a shape)
        assert any("missed the compiled code" in line for line in summary_lines())
        assert torch.equal(net(x), _eager_run(lambda: eager(x)))  # the one that starts the tuning again
        assert node.state is NodeState.RECORDING, "\n".join(PatchedModule.history[-4:])
        assert any("recorded calls no longer match" in line for line in PatchedModule.history)
        _calls_until_tuned(net, node, x, eager)
        torch.testing.assert_close(net(x), _eager_run(lambda: eager(x)))
        assert not node.dispatcher.watch.stale() and node.dispatcher.code_misses == 0


class _Table:
    """An object argument holding a tensor (as a KV cache holds its keys): dynamo guards the tensor's strides."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table


class _Lookup(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, state: _Table) -> torch.Tensor:
        return self.fc(x @ state.table).relu()


@pytest.mark.slow
def test_calls_that_miss_the_compiled_code_by_their_input_layout_are_recorded_and_compiled_next_time(tmp_path):
    """The first decoding step after a compiled prefill gets its cache in the prefill graph's output strides, which
    the decode graph never saw (GPT-2's `generate()`: one miss per request, for good). The calls that miss are
    recorded, so the re-tune they lead to compiles that layout too, and such calls stop missing."""
    _tune_with_whole_graph_inductor(tmp_path)
    net = _Lookup().eval()
    eager = eager_twin(net)
    enable()
    x = torch.randn(4, 16)
    dense = torch.randn(16, 16)
    transposed = _Table(dense.t().contiguous().t())  # the same values, other strides
    with torch.no_grad():
        for _ in range(3):
            net(x, _Table(dense.clone()))
        node = PatchedModule.of(net)
        assert node.state is NodeState.TUNED, PatchedModule.history
        for _ in range(jit_config.retune_after_misses):  # the last one starts the re-tune (blocking here)
            torch.testing.assert_close(net(x, transposed), _eager_run(lambda: eager(x, transposed)))
        assert node.state is NodeState.TUNED and node.missed_code == jit_config.retune_after_misses
        for _ in range(3):  # both layouts are served by compiled code now
            torch.testing.assert_close(net(x, transposed), _eager_run(lambda: eager(x, transposed)))
            torch.testing.assert_close(net(x, _Table(dense.clone())), _eager_run(lambda: eager(x, _Table(dense))))
        assert node.missed_code == jit_config.retune_after_misses, "\n".join(PatchedModule.history[-4:])
        assert node.dispatcher.code_misses == 0


def test_a_submodule_put_in_after_tuning_and_first_called_in_training_mode_is_not_adopted():
    """Adopted, it would carry a forward wrapper in its `__dict__`, which the tuned graph's guards see."""
    net, x = _embedder_tuned_with_counting_backend()
    net.fc = torch.nn.Linear(32, 32)
    net.train()
    net(x).sum().backward()
    net.eval()
    assert PatchedModule.of(net.fc) is None and "forward" not in vars(net.fc)


def test_a_bert_asked_once_for_hidden_states_stays_tuned_and_answers_both_kinds_of_call():
    """transformers 5 registers output-capturing hooks on every layer at the first call that asks for hidden states
    or attentions, and never removes them; they do nothing for the other calls (`inert_hooks`). Before, that one
    call left the model untuned (or its tuned graph unused) for the rest of the process."""
    from jit_helpers import CountingBackend

    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32)
    torch.manual_seed(0)
    bert = transformers.BertModel(config).eval()
    eager = eager_twin(bert)
    jit_config.min_parameters = 0
    jit_config.strategy = OneBackendStrategy(CountingBackend())
    enable()
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        flagged = bert(input_ids=ids, output_hidden_states=True)  # before tuning: hooks from the start
        for _ in range(3):
            bert(input_ids=ids)
        assert PatchedModule.of(bert).state is NodeState.TUNED, PatchedModule.history
        flagged_again = bert(input_ids=ids, output_hidden_states=True)
        infers = CountingBackend.infers
        plain = bert(input_ids=ids)
        assert CountingBackend.infers == infers + 1  # the tuned graph still serves the calls without the flag
        want_plain = _eager_run(lambda: eager(input_ids=ids))
        want_flagged = _eager_run(lambda: eager(input_ids=ids, output_hidden_states=True))
    torch.testing.assert_close(plain.last_hidden_state, want_plain.last_hidden_state)
    for got in (flagged, flagged_again):
        assert len(got.hidden_states) == len(want_flagged.hidden_states) == 3
        torch.testing.assert_close(got.hidden_states, want_flagged.hidden_states)
