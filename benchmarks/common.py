"""What every benchmark shares: its command line's common options, the run's environment, and where results go.

Every results JSON starts with the same header (`environment()`): benchmark name, UTC date, git commit of the
measured tree, device, python/torch/package versions, and the command line. A run writes a new file under
`benchmarks/results/local/` (ignored by git), named

    <benchmark>-<device>[-<detail>...]-<commit>-<YYYYmmddTHHMMSSZ>.json

so a plain run never dirties the tree and two runs never overwrite each other. Committing a result is a
deliberate step: `--out benchmarks/results/<name>.json` (or copy the file there).

Plain standard library at import time: the suite sets Inductor's cache folders before torch is imported.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: committed results (docs/benchmarks.md cites them); scripts write here only when `--out` says so
RESULTS_DIR = REPO / "benchmarks" / "results"
#: where a run's results go by default (in .gitignore)
LOCAL_RESULTS_DIR = RESULTS_DIR / "local"
PACKAGES = ("aitune", "torch", "triton", "timm", "torchvision", "transformers", "autowrapt", "wrapt", "nvtx",
            "torchao", "rich", "numpy")


def slug(text: str) -> str:
    """Lower-case letters, digits and single dashes: a piece of a file name (the device tool brings back files
    with plain names only)."""
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-")


def parser(description: str | None) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark has: `--out` and `--git-commit`."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None,
                   help=f"results JSON to write (default: a new file in {LOCAL_RESULTS_DIR.relative_to(REPO)}/)")
    p.add_argument("--git-commit", default=None,
                   help="the aitune commit measured, where the tree has no .git (default: git's HEAD)")
    return p


def case_options(
    p: argparse.ArgumentParser, *, model: str, batches: list[int], precision: str | None = "fp32"
) -> argparse.ArgumentParser:
    """The probes' case options: `--model` (a name from benchmarks/suite/models.py), `--batches` and, unless
    `precision` is None, `--precision` (fp32, or bf16 autocast)."""
    p.add_argument("--model", default=model, help=f"model name from benchmarks/suite/models.py (default {model})")
    p.add_argument("--batches", type=int, nargs="+", default=list(batches))
    if precision is not None:
        p.add_argument("--precision", choices=("fp32", "bf16"), default=precision,
                       help="bf16: bf16 autocast (the JIT through its precision option)")
    return p


def git_commit(explicit: str | None = None) -> str:
    """`explicit`, else the short HEAD commit of this checkout (with `+dirty` when tracked files changed)."""
    if explicit:
        return explicit
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}+dirty" if head and dirty else head or "unknown"


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def device_info(device: str) -> dict[str, Any]:
    """The measured device: its type and name (GPU model, or the CPU), and the settings that change timings."""
    import torch

    info: dict[str, Any] = {"type": torch.device(device).type, "cpu": platform.processor() or platform.machine(),
                            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    if info["type"] == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, capability=f"{props.major}.{props.minor}", memory_gib=round(
            props.total_memory / 2**30, 1), sm_count=props.multi_processor_count, cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version(), tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
            tf32_cudnn=torch.backends.cudnn.allow_tf32)
    else:
        info["name"] = f"CPU {info['cpu']} x{os.cpu_count()}"
    return info


def environment(benchmark: str, device: str, commit: str | None = None) -> dict[str, Any]:
    """The header of every results JSON: what was measured, when, on which tree and device, with what."""
    import torch

    return {
        "benchmark": benchmark,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(commit),
        "device": device_info(device),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "packages": package_versions(),
        "command": shlex.join(["python", "-m", _module_name(), *sys.argv[1:]]),
    }


def _module_name() -> str:
    """`benchmarks.probes.x` for the running script (as it is started with `python -m`)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name:
        return spec.name
    return Path(sys.argv[0]).as_posix()


def result_name(benchmark: str, device_name: str, *details: object, commit: str, date: str) -> str:
    """`<benchmark>-<device>[-<detail>...]-<commit>-<YYYYmmddTHHMMSSZ>.json` (see the module docstring)."""
    stamp = dt.datetime.fromisoformat(date).astimezone(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    pieces = [benchmark, slug(device_name), *(slug(d) for d in details if d not in (None, "")), slug(commit), stamp]
    return "-".join(p for p in pieces if p) + ".json"


def result_path(header: dict[str, Any], *details: object, out: Path | None = None) -> Path:
    """`out` when given, else a new file in LOCAL_RESULTS_DIR named by `result_name`."""
    if out is not None:
        return Path(out)
    name = result_name(header["benchmark"], header["device"]["name"], *details, commit=header["git_commit"],
                       date=header["date"])
    return LOCAL_RESULTS_DIR / name


def write_result(path: Path, document: dict[str, Any]) -> Path:
    """Write `document` as JSON to `path` (creating its folder) and say where; returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=1, default=str) + "\n")
    shown = path.resolve().relative_to(REPO) if path.resolve().is_relative_to(REPO) else path
    print(f"results: {shown}", flush=True)
    return path
