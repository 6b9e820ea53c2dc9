"""aitune_jit/worker_env.py: the worker's AITUNE_WORKER_* variables: read when asked, a wrong value warns once
per read and falls back to the default."""

from __future__ import annotations

import logging

from aitune_jit.worker_env import env_choice, env_number


def test_a_choice_is_read_case_blind_and_a_wrong_one_falls_back_with_a_warning(monkeypatch, caplog):
    monkeypatch.delenv("AITUNE_WORKER_X", raising=False)
    assert env_choice("AITUNE_WORKER_X", ("a", "b"), "a") == "a"
    monkeypatch.setenv("AITUNE_WORKER_X", " B ")
    assert env_choice("AITUNE_WORKER_X", ("a", "b"), "a") == "b"
    monkeypatch.setenv("AITUNE_WORKER_X", "c")
    with caplog.at_level(logging.WARNING, logger="aitune.jit"):
        assert env_choice("AITUNE_WORKER_X", ("a", "b"), "a") == "a"
    assert "AITUNE_WORKER_X='c' is none of a, b; using a" in caplog.text


def test_a_number_is_read_and_a_wrong_one_falls_back_with_a_warning(monkeypatch, caplog):
    monkeypatch.delenv("AITUNE_WORKER_X", raising=False)
    assert env_number("AITUNE_WORKER_X", 25.0) == 25.0
    monkeypatch.setenv("AITUNE_WORKER_X", "0.5")
    assert env_number("AITUNE_WORKER_X", 25.0) == 0.5
    monkeypatch.setenv("AITUNE_WORKER_X", "fast")
    with caplog.at_level(logging.WARNING, logger="aitune.jit"):
        assert env_number("AITUNE_WORKER_X", 25.0) == 25.0
    assert "AITUNE_WORKER_X='fast' is not a finite number; using 25" in caplog.text
    for text in ("inf", "nan", "1e400"):  # an infinite wait overflowed the worker's timers
        monkeypatch.setenv("AITUNE_WORKER_X", text)
        assert env_number("AITUNE_WORKER_X", 25.0) == 25.0
