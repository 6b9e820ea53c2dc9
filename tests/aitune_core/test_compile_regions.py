"""Compile regions: identical sibling blocks found, marked while a compile holds them, and left as they were."""

import inspect

import torch

from aitune_core.backends.compile_regions import MIN_REPEATS, CompileRegions, repeated_groups


class Block(torch.nn.Module):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(width, width)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.fc(self.norm(x)))


class Stack(torch.nn.Module):
    def __init__(self, depth: int = MIN_REPEATS + 1) -> None:
        super().__init__()
        self.embed = Block(16)
        self.layers = torch.nn.ModuleList(Block(16) for _ in range(depth))
        self.odd = Block(16)
        # single layers: never grouped
        self.heads = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(MIN_REPEATS + 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.odd(x)


def test_identical_siblings_form_a_group_single_layers_and_pairs_do_not():
    model = Stack()
    groups = repeated_groups(model)
    assert [len(g) for g in groups] == [MIN_REPEATS + 1] and groups[0][0] is model.layers[0]
    assert repeated_groups(Stack(depth=MIN_REPEATS - 1)) == []  # below MIN_REPEATS
    model.layers[1].fc = torch.nn.Linear(16, 16, bias=False)  # different parameters: not identical any more
    assert [len(g) for g in repeated_groups(model)] == [MIN_REPEATS]


def test_the_mark_keeps_eager_results_and_comes_off_symmetrically():
    model = Stack().eval()
    x = torch.randn(2, 16)
    expected = model(x)
    original = Block.__dict__["forward"]
    first = CompileRegions.install(model)
    second = CompileRegions.install(model)  # a second candidate of the same tuning run shares the mark
    assert first.blocks == second.blocks == MIN_REPEATS + 1 and first.groups == 1
    assert Block.forward is not original and getattr(Block.forward, "__aitune_region__", False)
    assert inspect.signature(model.layers[0].forward) == inspect.signature(original.__get__(model.layers[0]))
    torch.testing.assert_close(model(x), expected)
    first.remove()
    assert Block.forward is not original  # still held by the second
    second.remove()
    second.remove()  # idempotent
    assert Block.__dict__["forward"] is original


def test_an_inherited_forward_is_restored_by_removing_the_mark():
    class Derived(Block):
        pass

    model = torch.nn.Sequential(*(Derived() for _ in range(MIN_REPEATS)))
    regions = CompileRegions.install(model)
    assert "forward" in Derived.__dict__
    regions.remove()
    assert "forward" not in Derived.__dict__ and Derived.forward is Block.forward


def test_eager_calls_run_the_class_forward_even_while_another_thread_exports(monkeypatch):
    model = Stack().eval()
    x = torch.randn(2, 16)
    expected = model(x)
    monkeypatch.setattr(torch.compiler, "is_exporting", lambda: True)  # torch's flag is process-wide
    with CompileRegions.marked(model) as regions:
        assert regions.blocks == MIN_REPEATS + 1
        torch.testing.assert_close(model(x), expected)
    assert not hasattr(Block.forward, "__aitune_region__")


def test_a_scripted_block_class_is_never_marked():
    model = torch.nn.Sequential(*(torch.jit.script(Block()) for _ in range(MIN_REPEATS)))
    with CompileRegions.marked(model) as regions:
        assert regions.blocks == 0


def test_a_compiled_model_with_regions_matches_eager():
    model = Stack().eval()
    x = torch.randn(2, 16)
    graphs = []

    def capture(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    with torch.no_grad(), CompileRegions.marked(model):
        torch.testing.assert_close(torch.compile(model, backend=capture)(x), model(x))
    assert any("invoke_subgraph" in g.code for g in graphs)  # the layers were traced as one region


def test_a_class_its_authors_marked_is_left_alone():
    class Marked(Block):
        pass

    Marked.forward = torch.compiler.nested_compile_region(Block.forward)
    authors = Marked.__dict__["forward"]
    regions = CompileRegions.install(torch.nn.Sequential(*(Marked() for _ in range(MIN_REPEATS))))
    assert regions.blocks == 0 and Marked.__dict__["forward"] is authors
    regions.remove()
    assert Marked.__dict__["forward"] is authors


def test_a_forward_replaced_after_the_mark_came_off_is_the_one_marked_next_time():
    class Fresh(Block):
        pass

    model = torch.nn.Sequential(*(Fresh() for _ in range(MIN_REPEATS)))
    with CompileRegions.marked(model):
        pass

    def replaced(self, x):
        return x * 0

    Fresh.forward = replaced
    with CompileRegions.marked(model):
        assert Fresh.forward.__wrapped__ is replaced
        assert torch.equal(model(torch.ones(1, 16)), torch.zeros(1, 16))
    assert Fresh.__dict__["forward"] is replaced


def test_a_graph_that_changes_its_arguments_compiles_whole_on_a_gpu_only():
    from types import SimpleNamespace

    from aitune_core.backends.compile_regions import compiles_whole

    stateful, plain = SimpleNamespace(mutates_inputs=True), SimpleNamespace(mutates_inputs=False)
    assert compiles_whole([plain, stateful], torch.device("cuda"))  # a decoding step: host work in every call
    assert not compiles_whole([plain], torch.device("cuda"))  # (a CUDA graph may hide the regions' calls)
    assert not compiles_whole([stateful], torch.device("cpu"))  # (compile time counts more here)
    assert not compiles_whole([stateful], None)

