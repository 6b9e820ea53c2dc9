"""`python -m aitune.torch.jit cache list|clear [--dir DIR]`: show or clear the persistent JIT cache.

`list` prints one row per stored decision (module, graph, what was decided, size, age) as a rich table;
unusable entries (damaged, edited) are listed as such; a decision with a package for warm starts
(`packaging.py`) counts the package in its size. `clear` removes the decisions, the packages and, when aitune
chose Inductor's cache folder (`<dir>/inductor`, marked by `INDUCTOR_MARKER`), Inductor's cached kernels
too - only files aitune names; anything else in the folder stays.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from aitune_core.decision_store import INDUCTOR, INDUCTOR_MARKER, PACKAGES, DecisionStore


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m aitune.torch.jit cache",
                                     description="Show or clear aitune's persistent JIT tuning cache.")
    parser.add_argument("action", choices=("list", "clear"))
    parser.add_argument("--dir", help="cache folder (default: jit_config.cache_dir, i.e. $AITUNE_JIT_CACHE_DIR "
                                      "or ~/.cache/aitune/jit)")
    return parser


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def _size(num_bytes: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if num_bytes >= size:
            return f"{num_bytes / size:.1f} {unit}"
    return f"{num_bytes} B"


def _folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else 0


def _stat(path: Path) -> os.stat_result | None:
    """The entry file's status; None for a dangling link or a file removed meanwhile (another process's clear)."""
    try:
        return path.stat()
    except OSError:
        return None


def list_entries(root: Path) -> int:
    from rich.console import Console
    from rich.table import Table

    store = DecisionStore(root)
    table = Table(title=f"aitune JIT cache: {root}")
    for column in ("module", "graph", "decision", "size", "age", "source"):
        table.add_column(column)
    now = time.time()
    count = 0
    for path, decision in store.entries():
        count += 1
        own = decision is not None and (decision.package or "").startswith(f"{decision.key}.") and "/" not in str(
            decision.package)
        package = root / PACKAGES / str(decision.package) if own and decision is not None else None
        extra = package.stat().st_size if package is not None and package.is_file() else 0
        stat = _stat(path)
        size = _size((stat.st_size if stat else 0) + extra) + (" (with package)" if extra else "")
        age = _age(now - stat.st_mtime) if stat else "-"
        if decision is None:
            table.add_row(path.name, "-", "[red]unusable (ignored, re-tuned)[/red]", size, age, "-")
            continue
        table.add_row(*(str(value) for value in (decision.module, decision.graph, decision.describe(), size, age,
                                                 decision.source)))
    console = Console(file=sys.stdout, width=160)
    console.print(table)
    inductor = root / INDUCTOR
    print(f"{count} decision(s); Inductor cache under {inductor}: {_size(_folder_size(inductor))}")
    return 0


#: what aitune writes in the packages folder: `<key>.<build>.aotc|.pt2` and the scratch files of their writers
_OWN_PACKAGE = re.compile(r"\.?[0-9a-f]{64}\..+")


def clear(root: Path) -> int:
    """Remove what aitune wrote under `root` and nothing else: its decisions, its packages, and Inductor's folder
    when aitune made it (`INDUCTOR_MARKER`). A folder given as `--dir .` in a project held the project's
    own `packages/` and `decisions/config.json`, which were deleted."""
    removed = DecisionStore(root).clear()
    packages = root / PACKAGES
    if packages.is_dir():
        for path in packages.iterdir():
            if _OWN_PACKAGE.fullmatch(path.name):
                _remove(path)
        _remove_if_empty(packages)
    inductor = root / INDUCTOR
    if (inductor / INDUCTOR_MARKER).is_file():
        _remove(inductor)
    elif inductor.is_dir() and any(inductor.iterdir()):
        print(f"left {inductor}: not marked as the Inductor cache aitune made there; remove it yourself if it is")
    print(f"removed {removed} decision(s) from {root}")
    return 0


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _remove_if_empty(folder: Path) -> None:
    with contextlib.suppress(OSError):
        folder.rmdir()


def main(argv: Sequence[str]) -> int:
    options = _parser().parse_args(list(argv))
    if options.dir:
        root = Path(options.dir).expanduser()
    else:
        from aitune_jit.config import jit_config

        root = Path(jit_config.cache_dir)
    return list_entries(root) if options.action == "list" else clear(root)
