"""capture_torch_logs: torch's log records and warnings are collected, and torch's handlers come back."""

from __future__ import annotations

import logging
import warnings

import torch  # noqa: F401  (torch installs its logging handlers on import)

from aitune_core.torch_log_capture import MAX_LINES, capture_torch_logs


def test_torch_records_are_collected_not_printed(capsys):
    dynamo = logging.getLogger("torch._dynamo")
    before = list(dynamo.handlers)
    with capture_torch_logs() as captured:
        dynamo.error("guard creation failed, retrying")
        logging.getLogger("torch._inductor.codegen").warning("fell back")
        logging.getLogger("torch.fx.experimental.symbolic_shapes").info("not collected: below WARNING")
    assert captured.errors == 1
    assert captured.lines == [
        "ERROR torch._dynamo: guard creation failed, retrying",
        "WARNING torch._inductor.codegen: fell back",
    ]
    assert "guard creation" not in capsys.readouterr().err
    assert dynamo.handlers == before
    assert "1 at ERROR" in captured.summary()


def test_python_warnings_raised_inside_are_collected():
    with capture_torch_logs() as captured:
        warnings.warn("Dynamo detected a call to a cached function", UserWarning, stacklevel=1)
    assert captured.lines == ["UserWarning: Dynamo detected a call to a cached function"]


def test_application_loggers_are_untouched(caplog):
    with caplog.at_level(logging.WARNING, logger="myapp"), capture_torch_logs() as captured:
        logging.getLogger("myapp").warning("the application's own warning")
    assert "the application's own warning" in caplog.text
    assert captured.lines == []


def test_handlers_come_back_after_an_exception():
    root = logging.getLogger("torch")
    before, propagate = list(root.handlers), root.propagate
    try:
        with capture_torch_logs():
            raise RuntimeError("boom")
    except RuntimeError:
        pass
    assert root.handlers == before and root.propagate == propagate


def test_capture_is_bounded():
    with capture_torch_logs() as captured:
        for index in range(MAX_LINES + 5):
            logging.getLogger("torch._dynamo").warning("line %d", index)
    assert len(captured.lines) == MAX_LINES and captured.dropped == 5
