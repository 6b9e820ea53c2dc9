"""House rule: no file of the project's Python code is over 500 lines (one concept per file keeps files short).

The rule binds src/, tests/ and benchmarks/; a file that grows past it is split by concept, not trimmed of
its docstrings.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 500


def long_files(root: Path = ROOT, limit: int = LIMIT) -> dict[str, int]:
    """Path (relative to `root`) -> line count, for every .py file under src/, tests/ and benchmarks/ over `limit`."""
    found = {}
    for folder in ("src", "tests", "benchmarks"):
        for path in sorted((root / folder).rglob("*.py")):
            lines = len(path.read_text(encoding="utf-8").splitlines())
            if lines > limit:
                found[str(path.relative_to(root))] = lines
    return found


def test_the_finder_reports_a_long_file(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "long.py").write_text("x = 1\n" * 6)
    (tmp_path / "src" / "short.py").write_text("x = 1\n" * 5)
    assert long_files(tmp_path, limit=5) == {"src/long.py": 6}


def test_no_python_file_is_over_the_limit() -> None:
    assert long_files() == {}
