import logging
import time

import pytest
from rich.table import Table

from aitune_core.log import (
    SEPARATOR,
    THIN_SEPARATOR,
    StderrWarningHandler,
    format_duration,
    get_logger,
    install_stderr_warnings,
    log_separator,
    quiet_progress,
    remove_stderr_warnings,
    render_to_str,
    restore_progress,
    timed,
)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(114.0, "1.90min"), (19.7, "19.70s"), (0.04756, "47.56ms"), (60.0, "1.00min"), (1.0, "1.00s")],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_logger_names():
    assert get_logger("backend").name == "aitune.backend"
    assert get_logger().name == "aitune"
    assert get_logger("aitune.jit").name == "aitune.jit"
    assert get_logger("aitune_core.specs.tree").name == "aitune.core.specs.tree"


def test_timed_logs_completion_line(caplog):
    logger = get_logger("test")
    with caplog.at_level(logging.INFO, logger="aitune"):
        with timed(logger, "Tune `X`") as timer:
            time.sleep(0.01)
        with timed(logger):
            pass
    assert timer.elapsed is not None and timer.elapsed >= 0.01
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0].startswith("⏱️ Tune `X`: completed in ") and messages[0].endswith("ms")
    assert messages[1].startswith("⏱️ completed in ")


def test_timed_logs_even_on_error(caplog):
    with caplog.at_level(logging.INFO, logger="aitune"), pytest.raises(KeyError), timed(get_logger("t"), "step"):
        raise KeyError
    assert "step: completed in" in caplog.records[-1].getMessage()


def test_separators(caplog):
    assert SEPARATOR == "═" * 64 and THIN_SEPARATOR == "-" * 60
    with caplog.at_level(logging.INFO, logger="aitune"):
        log_separator(get_logger("t"))
        log_separator(get_logger("t"), thin=True)
    assert [r.getMessage() for r in caplog.records] == [SEPARATOR, THIN_SEPARATOR]


def test_render_to_str_is_plain_text():
    table = Table("A", "B")
    table.add_row("[red]x[/red]", "y" * 150)
    text = render_to_str(table)
    assert "\x1b[" not in text
    assert "A" in text and "x" in text
    assert max(len(line) for line in text.splitlines()) <= 160


@pytest.fixture
def unconfigured_logging(monkeypatch):
    """Call it in the test body: a process whose application configured no logging (pytest adds its root
    handlers after fixtures ran, so they are hidden from inside the test)."""
    yield lambda: monkeypatch.setattr(logging.getLogger(), "handlers", [])
    remove_stderr_warnings()


def test_stderr_warnings_once_per_cause(unconfigured_logging, capsys):
    unconfigured_logging()
    handler = install_stderr_warnings()
    assert handler is not None and install_stderr_warnings() is handler  # idempotent
    logger = get_logger("jit")
    logger.info("not shown")
    for _ in range(3):
        logger.warning("backend %s failed", "X")
    logger.warning("backend %s failed", "Y")
    logger.warning("first words", extra={"aitune_cause": "same-cause"})
    logger.warning("other words", extra={"aitune_cause": "same-cause"})
    err = capsys.readouterr().err
    assert err.count("[aitune] WARNING: backend X failed") == 1
    assert "backend Y failed" in err and "first words" in err
    assert "other words" not in err and "not shown" not in err


def test_stderr_warnings_step_aside_when_the_application_configured_logging(unconfigured_logging, capsys,
                                                                             monkeypatch):
    unconfigured_logging()
    assert install_stderr_warnings() is not None
    app_handler = logging.StreamHandler()  # configured after aitune was switched on
    monkeypatch.setattr(logging.getLogger(), "handlers", [app_handler])
    get_logger("jit").warning("seen by the application's handler only")
    assert "[aitune]" not in capsys.readouterr().err
    remove_stderr_warnings()
    assert install_stderr_warnings() is None  # configured before: nothing installed
    assert not any(isinstance(h, StderrWarningHandler) for h in logging.getLogger("aitune").handlers)


def test_warn_visibly_goes_to_stderr_without_a_handler_and_to_logging_with_one(capsys, caplog):
    from aitune_core.log import warn_visibly

    logger = logging.getLogger("aitune.test_warn_visibly")
    root_handlers = logging.getLogger().handlers[:]
    logging.getLogger().handlers.clear()  # as in a program that configured no logging
    try:
        warn_visibly(logger, "value %r is ignored", "abc")
    finally:
        logging.getLogger().handlers[:] = root_handlers
    assert capsys.readouterr().err == "value 'abc' is ignored\n"
    with caplog.at_level("WARNING", logger="aitune.test_warn_visibly"):
        warn_visibly(logger, "value %r is ignored", "xyz")
    assert [r.getMessage() for r in caplog.records] == ["value 'xyz' is ignored"]
    assert capsys.readouterr().err == ""


@pytest.fixture
def aitune_level():
    logger = logging.getLogger("aitune")
    before = logger.level
    logger.setLevel(logging.NOTSET)
    yield logger
    restore_progress()
    logger.setLevel(before)


def test_quiet_progress_keeps_info_out_of_a_program_that_logs_at_info(aitune_level, monkeypatch, caplog):
    monkeypatch.delenv("AITUNE_LOG_LEVEL", raising=False)
    quiet_progress()
    assert aitune_level.level == logging.WARNING
    with caplog.at_level(logging.INFO):  # the program's root logger at INFO
        get_logger("jit").info("a progress line")
        get_logger("jit").warning("a warning")
    assert [r.getMessage() for r in caplog.records if r.name.startswith("aitune")] == ["a warning"]
    restore_progress()
    assert aitune_level.level == logging.NOTSET


def test_quiet_progress_leaves_a_level_the_program_set(aitune_level, monkeypatch):
    monkeypatch.delenv("AITUNE_LOG_LEVEL", raising=False)
    aitune_level.setLevel(logging.DEBUG)
    quiet_progress()
    restore_progress()
    assert aitune_level.level == logging.DEBUG


def test_quiet_progress_takes_the_level_named_in_the_environment(aitune_level, monkeypatch, caplog):
    monkeypatch.setenv("AITUNE_LOG_LEVEL", "info")
    quiet_progress()
    assert aitune_level.level == logging.INFO
    aitune_level.setLevel(logging.NOTSET)
    monkeypatch.setenv("AITUNE_LOG_LEVEL", "LOUD")
    with caplog.at_level(logging.WARNING):
        quiet_progress()
    assert aitune_level.level == logging.WARNING
    assert any("AITUNE_LOG_LEVEL='LOUD' is not a logging level" in r.getMessage() for r in caplog.records)
