"""isolated_entry: a call-through function whose dynamo cache is its own."""

import torch
from core_fakes import TinyMLP

from aitune_core.backends.isolated_entry import isolated_entry


def test_entry_calls_through_with_args_and_kwargs():
    seen = []

    def target(*args, **kwargs):
        seen.append((args, kwargs))
        return "answer"

    entry = isolated_entry(target, "probe")
    assert entry(1, 2, key=3) == "answer"
    assert seen == [((1, 2), {"key": 3})]
    assert entry.__name__ == "probe" and entry.__code__.co_name == "probe"
    assert entry.__wrapped__ is target


def test_every_entry_has_a_code_object_of_its_own():
    first, second = isolated_entry(len), isolated_entry(len)
    assert first.__code__ is not second.__code__
    assert first([1, 2]) == second([1, 2]) == 2


def test_two_instances_of_one_class_compile_separately_and_keep_their_weights():
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch.manual_seed(0)
    a, b = TinyMLP().eval(), TinyMLP().eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        out_a = torch.compile(isolated_entry(a), backend=counting_backend)(x)
        out_b = torch.compile(isolated_entry(b), backend=counting_backend)(x)
        torch.testing.assert_close(out_a, a(x))
        torch.testing.assert_close(out_b, b(x))
    assert not torch.allclose(out_a, out_b)  # different weights: each graph ran its own instance's parameters
    assert len(graphs) == 2  # neither entry looked up the other's compiled graph


def test_plain_runs_of_the_body_are_counted_and_compiled_runs_are_not():
    from aitune_core.backends.isolated_entry import eager_runs

    torch.manual_seed(0)
    model = TinyMLP().eval()
    entry = isolated_entry(model)
    compiled = torch.compile(entry, backend="eager", fullgraph=True)
    x = torch.randn(3, 8)
    with torch.no_grad():
        before = eager_runs()
        entry(x)
        assert eager_runs() == before + 1
        compiled(x)  # traced (the count is dropped from the trace), then run as compiled code
        compiled(x)
        assert eager_runs() == before + 1


def test_a_plain_run_goes_through_the_runner_set_for_the_thread_once():
    from aitune_core.backends.isolated_entry import set_plain_runner

    torch.manual_seed(0)
    model = TinyMLP().eval()
    entry = isolated_entry(model)
    seen = []

    def runner(target, args, kwargs):
        seen.append((target is model, len(args), set_plain_runner(None) is None))  # (not set again inside)
        return target(*args, **kwargs)

    x = torch.randn(3, 8)
    with torch.no_grad():
        before = set_plain_runner(runner)
        try:
            torch.testing.assert_close(entry(x), model(x))
        finally:
            set_plain_runner(before)
        entry(x)  # no runner: the body runs as it is
    assert seen == [(True, 1, True)]
