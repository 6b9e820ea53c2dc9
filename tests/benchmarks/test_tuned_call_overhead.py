"""benchmarks/tuned_call_overhead.py: the helper that splits the backend's per-call cost."""

import torch

import tuned_call_overhead as tco


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
