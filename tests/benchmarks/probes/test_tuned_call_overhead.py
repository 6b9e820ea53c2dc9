"""benchmarks/probes/tuned_call_overhead.py: the helper that splits the backend's per-call cost."""

import torch

from benchmarks.probes import tuned_call_overhead as tco


def test_with_mark_step_copies_outputs_only_when_asked():
    kept = torch.ones(3)

    def fn(x):
        return {"out": kept, "other": (kept,)} if x else kept

    plain = tco._with_mark_step(fn)
    assert plain(False) is kept
    cloned = tco._with_mark_step(fn, clone=True)
    out = cloned(False)
    assert out is not kept and torch.equal(out, kept)
    nested = cloned(True)
    assert nested["out"] is not kept and nested["other"][0] is not kept
    assert torch.equal(nested["other"][0], kept)


def test_counter_delta_keeps_only_what_moved():
    before = {"stats.unique_graphs": 1, "inductor.cudagraph_skips": 0}
    after = {"stats.unique_graphs": 3, "inductor.cudagraph_skips": 0, "recompiles.ok": 2}
    assert tco.counter_delta(before, after) == {"recompiles.ok": 2, "stats.unique_graphs": 2}
    assert tco.counter_delta(after, after) == {}


def test_counter_snapshot_sees_a_new_dynamo_frame():
    before = tco.counter_snapshot()
    compiled = torch.compile(lambda t: t * 2 + 1, backend="eager")
    assert torch.equal(compiled(torch.ones(2)), torch.full((2,), 3.0))
    moved = tco.counter_delta(before, tco.counter_snapshot())
    assert moved.get("frames.ok", 0) >= 1


def test_profile_table_names_the_ops_of_the_profiled_calls():
    batch = tco.models.Batch((torch.ones(4, 4),))
    lines = tco.profile_table(lambda t: torch.relu(t @ t), batch, "cpu", calls=3)
    text = "\n".join(lines)
    assert "aten::relu" in text and "aten::mm" in text


def test_python_profile_names_the_python_functions_of_the_profiled_calls():
    def forward_under_test(t):
        return torch.relu(t * 2)

    batch = tco.models.Batch((torch.ones(4, 4),))
    lines = tco.python_profile(forward_under_test, batch, "cpu", calls=7)
    text = "\n".join(lines)
    assert "forward_under_test" in text
    assert any(line.split()[0] == "7" for line in lines if "forward_under_test" in line)


def test_watch_cost_alternates_with_and_without_the_watch_and_puts_it_back():
    import torch

    from benchmarks.probes import tuned_call_overhead as tco
    from benchmarks.suite import models

    class _Dispatcher:
        def __init__(self):
            self._watch = "the watch"
            self.seen = []

    dispatcher = _Dispatcher()
    linear = torch.nn.Linear(4, 4)

    def tuned(x):
        dispatcher.seen.append(dispatcher._watch)
        return linear(x)

    row = tco.watch_cost(tuned, dispatcher, models.Batch((torch.randn(2, 4),)), "cpu", iters=5, rounds=2)
    assert dispatcher._watch == "the watch"
    assert {"the watch", None} == set(dispatcher.seen)
    assert len(row["watch_cost_ratios"]) == 2 and row["watch_cost_ratio"] > 0
    assert row["jit_hook_watched_ms"] > 0 and row["jit_hook_unwatched_ms"] > 0
