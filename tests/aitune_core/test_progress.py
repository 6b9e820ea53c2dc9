"""aitune_core/strategies/progress.py: the spinner only on a terminal, and the step a strategy is in."""

from __future__ import annotations

from aitune_core.strategies import progress as progress_module


def test_no_spinner_without_a_terminal(monkeypatch):
    class NotATerminal:
        def isatty(self):
            return False

    class Terminal:
        def isatty(self):
            return True

    monkeypatch.setattr(progress_module.sys, "stderr", NotATerminal())
    assert not progress_module._progress_enabled()
    monkeypatch.setattr(progress_module.sys, "stderr", Terminal())
    assert progress_module._progress_enabled()
    monkeypatch.setenv(progress_module.PROGRESS_ENV, "0")
    assert not progress_module._progress_enabled()


def test_the_strategy_names_its_step_while_it_runs():
    from aitune_core.strategies.progress import current_phase, progress

    assert current_phase() is None
    with progress("Validating X"):
        assert current_phase() == "Validating X"
        with progress("Profiling X"):
            assert current_phase() == "Profiling X"
        assert current_phase() == "Validating X"
    assert current_phase() is None
