"""The patch itself: identity on/off, what becomes a node, decorator scopes, copies, dynamo, the fast path."""

from __future__ import annotations

import copy
import inspect
import io
import os
import pickle
import threading
import types

import pytest
import torch
from jit_helpers import MLP, Block, CountingBackend, make_mlp, run, states
from torch._dynamo.backends.debugging import ExplainWithBackend

from aitune.torch.jit import disable, enable, is_enabled
from aitune_jit import hook
from aitune_jit.config import jit_config
from aitune_jit.decorator import patch_for_jit_tuning, prepare_for_jit_tuning
from aitune_jit.patched_module import PatchedModule
from aitune_jit.runtime import OUT_OF_SCOPE, PASS
from aitune_jit.state import NodeState


def test_enable_disable_restores_call_identity():
    original = torch.nn.Module.__call__
    assert not is_enabled()
    enable()
    enable()  # idempotent
    assert is_enabled()
    assert torch.nn.Module.__call__ is not original
    disable()
    assert torch.nn.Module.__call__ is original
    assert not is_enabled()
    disable()  # idempotent
    assert torch.nn.Module.__call__ is original


def test_import_enable_and_disable_modules():
    import importlib
    import sys

    original = torch.nn.Module.__call__
    sys.modules.pop("aitune.torch.jit.enable", None)
    importlib.import_module("aitune.torch.jit.enable")
    assert is_enabled() and hook.is_global_mode()
    sys.modules.pop("aitune.torch.jit.disable", None)
    importlib.import_module("aitune.torch.jit.disable")
    assert torch.nn.Module.__call__ is original


def test_disable_gives_every_module_back_untouched():
    jit_config.backends = [CountingBackend()]
    jit_config.min_parameters = 0
    jit_config.detect_graph_breaks = False
    model = make_mlp()
    reference = run(model, [2, 3, 4])
    enable()
    tuned = run(model, [2, 3, 4])
    assert PatchedModule.of(model).state is NodeState.TUNED
    assert "forward" in model.__dict__
    disable()
    for module in model.modules():
        assert "forward" not in module.__dict__
        assert hook.NODE_ATTR not in module.__dict__
    after = run(model, [2, 3, 4])
    for a, b, c in zip(reference, tuned, after):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, c)


def test_modules_built_before_enable_are_seen_and_containers_are_never_nodes():
    model = make_mlp()  # built before the hook
    jit_config.min_samples = 100  # stay in recording: only the hierarchy matters here
    jit_config.min_parameters = 0
    enable()
    run(model, [2])
    root = PatchedModule.of(model)
    assert root is not None and root.parent is None and root.level == 0
    assert PatchedModule.of(model.blocks) is None  # Sequential: a container
    assert model.blocks.__dict__[hook.NODE_ATTR] is PASS
    # the blocks attach to the nearest node above the container: the root
    assert [child.path for child in root.children] == ["MLP.blocks.0", "MLP.blocks.1", "MLP.head"]
    block = PatchedModule.of(model.blocks[0])
    assert block.parent is root and block.level == 1
    assert [c.name for c in block.children] == ["Linear", "LayerNorm", "ReLU"]
    assert all(c.level == 2 for c in block.children)


def test_torch_internals_and_aitune_modules_are_never_nodes():
    enable()
    traced = torch.fx.symbolic_trace(make_mlp())
    enable()  # symbolic_trace patches Module.__call__ temporarily and puts ours back
    with torch.no_grad():
        traced(torch.randn(2, 32))
    assert traced.__dict__[hook.NODE_ATTR] is PASS
    assert hook.is_excluded(type(traced))
    from aitune_jit.tuner import ForwardOnly

    assert hook.is_excluded(ForwardOnly)
    assert hook.is_excluded(torch.nn.ModuleList) and hook.is_excluded(torch.nn.Sequential)

    class MySequential(torch.nn.Sequential):  # a user's subclass is a module of its own
        pass

    assert not hook.is_excluded(MySequential)


def test_decorator_mode_tunes_only_modules_built_inside():
    jit_config.backends = [CountingBackend()]
    jit_config.min_parameters = 0
    jit_config.detect_graph_breaks = False
    outside = make_mlp(seed=3)

    @patch_for_jit_tuning
    def create():
        return make_mlp(seed=4)

    inside = create()
    assert torch.nn.Module.__init__ is not None and hook.is_installed() and not hook.is_global_mode()
    run(outside, [2, 3, 4])
    run(inside, [2, 3, 4])
    assert PatchedModule.of(outside) is None
    assert outside.__dict__[hook.NODE_ATTR] is OUT_OF_SCOPE
    assert PatchedModule.of(inside).state is NodeState.TUNED
    assert set(states(inside).values()) == {"tuned", "detached"}
    assert [r.path for r in PatchedModule.roots()] == ["MLP"]
    original = hook.original_call()
    disable()
    assert torch.nn.Module.__call__ is original


def test_the_decorator_on_a_generator_or_async_factory_tunes_what_its_body_builds():
    # the scope closed when the generator or coroutine object was returned: nothing was tuned, silently
    import asyncio

    jit_config.min_samples = 100

    @patch_for_jit_tuning
    def models():
        yield Block()
        yield Block()

    @patch_for_jit_tuning
    async def build():
        await asyncio.sleep(0)
        return Block()

    built = [*models(), asyncio.run(build())]
    assert inspect.isgeneratorfunction(models) and inspect.iscoroutinefunction(build)
    after = Block()
    for module in (*built, after):
        with torch.no_grad():
            module(torch.randn(2, 32))
    assert all(PatchedModule.of(module) is not None for module in built)
    assert PatchedModule.of(after) is None
    disable()


def test_prepare_for_jit_tuning_context_manager_and_threads():
    jit_config.min_samples = 100
    built_elsewhere: list[torch.nn.Module] = []
    with prepare_for_jit_tuning():
        inside = Block()
        thread = threading.Thread(target=lambda: built_elsewhere.append(Block()))
        thread.start()
        thread.join()
    after = Block()
    for module in (inside, built_elsewhere[0], after):
        with torch.no_grad():
            module(torch.randn(2, 32))
    assert PatchedModule.of(inside) is not None
    assert PatchedModule.of(built_elsewhere[0]) is None  # another thread's construction is not in scope
    assert PatchedModule.of(after) is None


def test_global_mode_after_decorator_mode_adopts_out_of_scope_modules():
    jit_config.min_samples = 100
    outside = Block()
    with prepare_for_jit_tuning():
        pass
    with torch.no_grad():
        outside(torch.randn(2, 32))
    assert PatchedModule.of(outside) is None
    enable()
    with torch.no_grad():
        outside(torch.randn(2, 32))
    assert PatchedModule.of(outside) is not None


def test_forward_signature_and_copies_of_wrapped_modules():
    jit_config.min_samples = 100
    jit_config.min_parameters = 0
    model = make_mlp()
    enable()
    run(model, [2])
    assert PatchedModule.of(model).state is NodeState.RECORDING
    assert isinstance(model.__dict__["forward"], object) and "forward" in model.__dict__
    assert list(inspect.signature(model.forward).parameters) == ["x"]

    clone = copy.deepcopy(model)
    assert "forward" not in clone.__dict__  # the class's forward, not aitune's wrapper (see module_copies)
    with torch.no_grad():
        clone.head.weight.add_(1.0)
    x = torch.randn(3, 32)
    with torch.no_grad():
        assert not torch.allclose(clone(x), model(x))  # computes with its own weights
    assert PatchedModule.of(clone) is not None and PatchedModule.of(clone) is not PatchedModule.of(model)

    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x))
    assert copy.deepcopy(PASS) is PASS and copy.copy(PASS) is PASS
    assert pickle.loads(pickle.dumps(PASS)) is None  # a pickle carries no aitune object


_UNPICKLE_WITHOUT_AITUNE = """
import sys
sys.path.insert(0, sys.argv[3])  # tiny_net
for name in ("aitune", "aitune_jit", "aitune_core", "aitune_aot"):
    sys.modules[name] = None  # any import of aitune in the unpickling fails
import pytest
import torch
model = torch.load(sys.argv[1], weights_only=False)
x, expected = torch.load(sys.argv[2])
assert "forward" not in model.__dict__ or model.__dict__["forward"].__self__ is model
assert not any(k.startswith("_aitune") and v is not None for m in model.modules() for k, v in vars(m).items())
with torch.no_grad():
    torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
print("UNPICKLED-OK")
"""


_TINY_NET = """
import torch

class TinyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.body(x))
"""


@pytest.mark.parametrize("tuned", [False, True])
def test_pickle_taken_while_jit_tuning_loads_without_aitune(tmp_path, monkeypatch, tuned):
    """A whole-model pickle taken while JIT tuning is on (recording or tuned) is a pickle of the plain model."""
    import subprocess
    import sys

    (tmp_path / "tiny_net.py").write_text(_TINY_NET)
    monkeypatch.syspath_prepend(str(tmp_path))
    import tiny_net

    jit_config.backends = [CountingBackend()]
    jit_config.min_samples = 2 if tuned else 100
    jit_config.min_parameters = 0
    jit_config.detect_graph_breaks = False
    torch.manual_seed(0)
    model = tiny_net.TinyNet().eval()
    enable()
    with torch.no_grad():
        for batch in (2, 3, 4):
            model(torch.randn(batch, 8))
    assert PatchedModule.of(model).state is (NodeState.TUNED if tuned else NodeState.RECORDING)
    x = torch.randn(5, 8)
    with torch.no_grad():
        expected = model(x)
    torch.save(model, tmp_path / "model.pt")
    torch.save((x, expected), tmp_path / "io.pt")
    env = {k: v for k, v in os.environ.items() if k != "AUTOWRAPT_BOOTSTRAP"}
    result = subprocess.run(
        [sys.executable, "-c", _UNPICKLE_WITHOUT_AITUNE, str(tmp_path / "model.pt"), str(tmp_path / "io.pt"),
         str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0 and "UNPICKLED-OK" in result.stdout, result.stderr[-3000:]


def test_dynamo_never_traces_into_the_hook():
    jit_config.backends = [CountingBackend()]
    jit_config.min_parameters = 0
    jit_config.detect_graph_breaks = False
    enable()
    recording = make_mlp(seed=5)
    jit_config.min_samples = 100
    run(recording, [2])
    tuned = make_mlp(seed=6)
    jit_config.min_samples = 2
    run(tuned, [2, 3])
    assert PatchedModule.of(recording).state is NodeState.RECORDING
    assert PatchedModule.of(tuned).state is NodeState.TUNED
    for model in (recording, tuned):
        explainer = ExplainWithBackend("eager")
        compiled = torch.compile(model, backend=explainer)
        x = torch.randn(3, 32)
        with torch.no_grad():
            result = compiled(x)
            expected = type(model).forward(model, x)  # the class's forward: no aitune code involved
        torch.testing.assert_close(result, expected)
        output = explainer.output()
        assert output.graph_count == 1, str(output)  # one graph: dynamo went through the hook without a break
        assert output.graph_break_count == 0


def test_settled_nodes_take_the_fast_path():
    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False
    jit_config.skip_modules = ["MLP"]  # the root is skipped: its children are tuned
    jit_config.min_parameters = 0
    model = make_mlp()
    enable()
    run(model, [2, 3, 4, 5, 6, 7, 8, 9])
    nodes = {n.path: n for n in PatchedModule.of(model).subtree()}
    assert nodes["MLP"].state is NodeState.SKIPPED
    assert nodes["MLP.blocks.0"].state is NodeState.TUNED
    assert all(node.fast for node in nodes.values()), {p: n.fast for p, n in nodes.items()}
    counts = {path: node.call_count for path, node in nodes.items()}
    run(model, [2, 3])
    assert {path: node.call_count for path, node in nodes.items()} == counts  # no bookkeeping any more


def test_call_stack_is_per_thread():
    jit_config.min_samples = 1000
    jit_config.min_parameters = 0
    models = [MLP().eval() for _ in range(4)]
    enable()
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def serve(model: torch.nn.Module) -> None:
        try:
            barrier.wait()
            run(model, [2] * 20)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=serve, args=(m,)) for m in models]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for model in models:
        root = PatchedModule.of(model)
        assert root.parent is None
        assert [c.path for c in root.children] == ["MLP.blocks.0", "MLP.blocks.1", "MLP.head"]
        assert all(len(c.children) == 3 for c in root.children[:2])


def _distinct_modules(count: int) -> list[torch.nn.Module]:
    """`count` modules of different classes, each with a forward of its own (a code object of its own)."""

    def forward(self, x):
        return self.fc(x).relu() * 2

    modules = []
    for i in range(count):
        own_forward = types.FunctionType(forward.__code__.replace(), forward.__globals__, "forward")
        cls = type(f"Distinct{i}", (Block,), {"forward": own_forward})
        modules.append(cls(8 + i).eval())
    return modules


def test_many_modules_compiled_under_the_hook_each_get_their_graph():
    """dynamo's recompile limit (8 per code object) must not be reached because every compiled module would
    start at the hook's code: twelve different modules compiled by the user, and twelve compiled the way
    backends compile them (a ForwardOnly view, hook bypassed), each get a graph."""
    from aitune_jit.runtime import bypassed
    from aitune_jit.tuner import ForwardOnly

    jit_config.min_samples = 1000  # nodes stay RECORDING: their forward wrapper is installed
    jit_config.min_parameters = 0
    enable()
    graphs = 0

    def counting_backend(gm, example_inputs):
        nonlocal graphs
        graphs += 1
        return gm.forward

    user_modules = _distinct_modules(12)
    with torch.no_grad():
        for module in user_modules:
            module(torch.randn(2, module.fc.in_features))  # adopted, recording
            compiled = torch.compile(module, backend=counting_backend)
            x = torch.randn(3, module.fc.in_features)
            torch.testing.assert_close(compiled(x), type(module).forward(module, x))
    assert graphs == 12
    assert all(PatchedModule.of(m).state is NodeState.RECORDING for m in user_modules)
    assert all(PatchedModule.of(m).recorder.total_calls == 1 for m in user_modules)  # compiled calls not recorded

    graphs = 0
    with bypassed(), torch.no_grad():
        for module in _distinct_modules(12):
            compiled = torch.compile(ForwardOnly(module, module.forward), backend=counting_backend)
            compiled(torch.randn(3, module.fc.in_features))
    assert graphs == 12


def test_forward_wrapper_looks_like_the_bound_forward():
    jit_config.min_samples = 100
    jit_config.min_parameters = 0
    model = make_mlp()
    enable()
    run(model, [2])
    wrapper = model.__dict__["forward"]
    assert model.forward.__self__ is model
    assert model.forward.__func__ is MLP.forward
    assert model.forward.__name__ == "forward"
    assert inspect.signature(wrapper) == inspect.signature(MLP.forward.__get__(model))
