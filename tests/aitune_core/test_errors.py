"""errors: the shared exception hierarchy and `brief`, the one-line form of an exception for warnings."""

from __future__ import annotations

from aitune_core.errors import BRIEF_LINE_CHARS, AITuneError, BackendBuildError, brief


def test_every_deliberate_error_is_an_aitune_error():
    assert issubclass(BackendBuildError, AITuneError)


def test_brief_is_one_line_of_the_first_lines_without_the_stack():
    text = ("Consider annotating your code\n\nconsider using guard_or_false\nCaused by: if x.item() > 100\n"
            '  File "/x/model.py", line 7, in forward\n    if x.item() > 100:\n       ^^^^^^^^^^\n'
            "For more information, run with TORCH_LOGS=dynamic\n" + "z" * 5000)
    line = brief(RuntimeError(text))
    assert "\n" not in line and line.startswith("RuntimeError: Consider annotating your code / consider using")
    assert "Caused by: if x.item() > 100" in line and "File" not in line and "^^^" not in line
    assert line.endswith(" / ...") and len(line) < 3 * (BRIEF_LINE_CHARS + 10)
    assert brief(ValueError("short")) == "ValueError: short" and brief(KeyError()) == "KeyError"
    assert len(brief(ValueError("y" * 1000))) < BRIEF_LINE_CHARS + 30
