"""`python -m aitune.torch.jit cache list|clear [--dir DIR]`: show or clear the persistent JIT cache.

`list` prints one row per stored decision (module, graph, what was decided, size, age) as a rich table;
unusable entries (damaged, edited) are listed as such; a decision with a package for warm starts
(`packaging.py`) counts the package in its size. `clear` removes the decisions, the packages and, when aitune
chose Inductor's cache folder (`<dir>/inductor`), Inductor's cached kernels too.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from aitune_core.decision_store import INDUCTOR, PACKAGES, DecisionStore


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
        size = _size(path.stat().st_size + extra) + (" (with package)" if extra else "")
        age = _age(now - path.stat().st_mtime)
        if decision is None:
            table.add_row(path.name, "-", "[red]unusable (ignored, re-tuned)[/red]", size, age, "-")
            continue
        table.add_row(decision.module, decision.graph, decision.describe(), size, age, decision.source)
    console = Console(file=sys.stdout, width=160)
    console.print(table)
    inductor = root / INDUCTOR
    print(f"{count} decision(s); Inductor cache under {inductor}: {_size(_folder_size(inductor))}")
    return 0


def clear(root: Path) -> int:
    removed = DecisionStore(root).clear()
    for folder in (root / INDUCTOR, root / PACKAGES):
        if folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
    print(f"removed {removed} decision(s) from {root}")
    return 0


def main(argv: Sequence[str]) -> int:
    options = _parser().parse_args(list(argv))
    if options.dir:
        root = Path(options.dir).expanduser()
    else:
        from aitune_jit.config import jit_config

        root = Path(jit_config.cache_dir)
    return list_entries(root) if options.action == "list" else clear(root)
