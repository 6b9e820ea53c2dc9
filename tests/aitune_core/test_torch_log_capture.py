"""capture_torch_logs: torch's log records and warnings are collected, and torch's handlers come back."""

from __future__ import annotations

import logging
import re
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
        "torch._dynamo [error]: guard creation failed, retrying",
        "torch._inductor.codegen [warning]: fell back",
    ]
    assert "guard creation" not in capsys.readouterr().err
    assert dynamo.handlers == before
    assert "1 at error level" in captured.summary()
    # the history quotes the first record: torch's level follows its logger's name and is not an ERROR line
    assert "first: torch._dynamo [error]: guard creation" in captured.summary()
    assert not re.search(r"(^|\s)ERROR\b", captured.summary())


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


def _on_another_thread(task) -> list[BaseException]:
    import threading

    failures: list[BaseException] = []

    def run() -> None:
        try:
            task()
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return failures


def test_other_threads_warnings_and_the_programs_filters_are_left_alone(monkeypatch):
    """A background job captures on its thread while the program runs on: the program's warnings are not taken, and
    its filters (here `-W error`) still apply to it."""
    shown: list[str] = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *args, **kwargs: shown.append(str(message)))
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        with capture_torch_logs() as captured:
            assert _on_another_thread(lambda: warnings.warn("the program's own", UserWarning, stacklevel=1)) == []
            warnings.warn("torch's, on the capturing thread", UserWarning, stacklevel=1)
            warnings.simplefilter("error")  # the program's filters are global: the capture never replaced them
            failures = _on_another_thread(lambda: warnings.warn("an error now", DeprecationWarning, stacklevel=1))
            assert len(failures) == 1 and isinstance(failures[0], DeprecationWarning)
    assert shown == ["the program's own"]
    assert captured.lines == ["UserWarning: torch's, on the capturing thread"]


def test_showwarning_comes_back_unless_the_program_replaced_it_meanwhile(monkeypatch):
    before = warnings.showwarning
    with capture_torch_logs():
        assert warnings.showwarning is not before
    assert warnings.showwarning is before

    def programs(*args, **kwargs) -> None:
        return None

    with capture_torch_logs():
        monkeypatch.setattr(warnings, "showwarning", programs)
    assert warnings.showwarning is programs


def test_a_process_forked_during_a_capture_gets_torchs_handlers_and_showwarning_back():
    import os

    import pytest

    if not hasattr(os, "fork"):
        pytest.skip("needs os.fork")
    dynamo = logging.getLogger("torch._dynamo")
    handlers, show = list(dynamo.handlers), warnings.showwarning
    with capture_torch_logs():
        pid = os.fork()
        if pid == 0:
            os._exit(0 if dynamo.handlers == handlers and warnings.showwarning is show else 1)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _deprecated_argument() -> None:
    warnings.warn("deprecated argument", FutureWarning, stacklevel=1)


def test_a_warning_collected_first_is_still_shown_once_to_the_program(monkeypatch):
    """A replay on the job thread warns at a place before the program does: Python's once-per-place record must
    not swallow the program's own warning there."""
    shown: list[str] = []
    monkeypatch.setattr(warnings, "showwarning", lambda message, *args, **kwargs: shown.append(str(message)))
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        with capture_torch_logs() as captured:
            _deprecated_argument()  # the job's replay
            assert _on_another_thread(_deprecated_argument) == []  # the program's call
            assert _on_another_thread(_deprecated_argument) == []  # once per place, as without aitune
    assert shown == ["deprecated argument"]
    assert captured.lines == ["FutureWarning: deprecated argument"]
