"""aitune_jit/held_warnings.py: this thread's WARNING records of a logger wait for the caller's verdict; other
threads' records and lower levels pass at once."""

from __future__ import annotations

import logging
import threading

from aitune_jit.held_warnings import held_warnings

_logger = logging.getLogger("aitune.tests.held")


def _levels(caplog) -> list[tuple[str, int]]:
    return [(r.getMessage(), r.levelno) for r in caplog.records if r.name == _logger.name]


def test_released_records_come_out_as_they_were_after_the_lower_ones(caplog):
    caplog.set_level(logging.DEBUG, logger="aitune")
    with held_warnings(_logger) as held:
        _logger.warning("candidate failed")
        _logger.info("progress")
        assert _levels(caplog) == [("progress", logging.INFO)]
        held.release()
    assert _levels(caplog) == [("progress", logging.INFO), ("candidate failed", logging.WARNING)]
    assert not _logger.filters


def test_demoted_records_come_out_at_debug_and_unsettled_ones_are_released_at_the_end(caplog):
    caplog.set_level(logging.DEBUG, logger="aitune")
    with held_warnings(_logger) as held:
        _logger.warning("not the backend's fault")
        held.demote()
        _logger.warning("after the verdict")  # (the filter is gone: as usual)
    with held_warnings(_logger):
        _logger.error("never settled")
    assert _levels(caplog) == [("not the backend's fault", logging.DEBUG), ("after the verdict", logging.WARNING),
                               ("never settled", logging.ERROR)]


def test_another_threads_warnings_are_not_held(caplog):
    caplog.set_level(logging.DEBUG, logger="aitune")
    with held_warnings(_logger) as held:
        thread = threading.Thread(target=_logger.warning, args=("the program's",))
        thread.start()
        thread.join()
        assert _levels(caplog) == [("the program's", logging.WARNING)]
        held.demote()


def test_demote_with_a_choice_demotes_those_it_picks_and_releases_the_rest(caplog):
    logger = logging.getLogger("aitune.test_held_choice")
    with caplog.at_level(logging.DEBUG, logger="aitune.test_held_choice"), held_warnings(logger) as held:
        logger.warning("a graph break", extra={"aitune_failure": "break"})
        logger.warning("a real failure")
        held.demote(lambda record: getattr(record, "aitune_failure", None) == "break")
    levels = {r.getMessage(): r.levelname for r in caplog.records}
    assert levels == {"a graph break": "DEBUG", "a real failure": "WARNING"}
