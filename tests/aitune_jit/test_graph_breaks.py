"""graph_breaks: dynamo's breaks are reported one line each, and a call dynamo cannot trace at all is reported in
one short line, not dynamo's page of explanation."""

from __future__ import annotations

import torch

from aitune_jit.graph_breaks import find_graph_breaks


def test_a_break_is_reported_with_the_users_line():
    def branchy(x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent control flow: a break
            return x * 2
        return x - 1

    report = find_graph_breaks(branchy, (torch.ones(3),), {})
    assert report.has_breaks and report.error is None and report.graph_count >= 2


def test_a_call_dynamo_cannot_trace_is_one_short_line(monkeypatch):
    # a custom op without a fake implementation made the exit summary carry dynamo's page and the user's stack
    page = "TorchRuntimeError: cannot run it on fake tensors\n" + '  File "user.py", line 3, in forward\n' * 30

    def refusing(*args, **kwargs):
        raise RuntimeError(page)

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: refusing)
    report = find_graph_breaks(lambda x: x, (torch.ones(2),), {})
    assert report.has_breaks and report.error is not None
    assert "\n" not in report.summary() and len(report.summary()) < 800 and 'File "user.py"' not in report.summary()
    assert "cannot run it on fake tensors" in report.summary()
