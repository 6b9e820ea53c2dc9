"""What a `background_tuning` run's rows say: each contender's summary (latency during and after tuning,
time-to-tuned on both clocks, outputs against eager), the issue's acceptance ratios, and the printed table.

Apart from the driver (`background_tuning.py`) so that each stays one concept and readable; the driver keeps
the raw rows and the results file.
"""

from __future__ import annotations

import statistics
from typing import Any


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _by_phase(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Latency from the due time of the requests served while tuning, by the step the job's strategy was in
    (`current_phase`: its first word, "Building" / "Validating" / "Profiling"; "other": the job elsewhere or
    between jobs): count, p50, p99 and max in ms. Why: the slowest requests during tuning are the ones to explain,
    and the step tells which part of the job shared the machine with them."""
    groups: dict[str, list[float]] = {}
    for r in rows[1:]:
        if "phase" in r and "late_s" in r and r.get("tuning", not r["tuned"]):
            name = (r["phase"] or "other").split(" ", 1)[0]
            groups.setdefault(name, []).append(r["latency_s"] + r["late_s"])
    return {name: {"count": len(v), "p50_ms": 1e3 * statistics.median(v), "p99_ms": 1e3 * (_pct(v, 0.99) or 0.0),
                   "max_ms": 1e3 * max(v)} for name, v in sorted(groups.items())}


def summarize(data: dict[str, Any], eager: dict[str, Any] | None) -> dict[str, Any]:
    if "error" in data:
        return {key: data[key] for key in ("error", "exit_status") if key in data}
    rows = data["rows"]
    # while tuning runs (the root not tuned yet, or the worker still busy with other graphs) / after it all ended
    during = [r["latency_s"] for r in rows if r.get("tuning", not r["tuned"])]
    # the process's first request pays CUDA/cuDNN start-up in every contender, eager included (`first_call_s`)
    during_later = [r["latency_s"] for r in rows[1:] if r.get("tuning", not r["tuned"])]
    # the same from when each request was due (`late_s`: a thread that wakes from its pause waits for the GIL)
    due_during = [r["latency_s"] + r["late_s"] for r in rows[1:] if "late_s" in r and r.get("tuning", not r["tuned"])]
    after = [r["latency_s"] for r in rows if not r.get("tuning", not r["tuned"])]
    first_tuned = next((r for r in rows if r["tuned"]), None)
    summary = {
        "requests": len(rows),
        # the end of the first request a tuned root answered (for torch.compile: the end of its first call)
        "time_to_tuned_s": first_tuned["t"] + first_tuned["latency_s"] if first_tuned is not None else None,
        "root_state": data.get("root_state"),
        "root_reason": data.get("root_reason"),
        "first_call_s": rows[0]["latency_s"],
        "during_p50_ms": 1e3 * statistics.median(during) if during else None,
        "during_p99_ms": 1e3 * _pct(during, 0.99) if during else None,
        "during_max_ms": 1e3 * max(during) if during else None,
        "during_max_after_first_ms": 1e3 * max(during_later) if during_later else None,
        "due_during_p99_ms": 1e3 * _pct(due_during, 0.99) if due_during else None,
        "due_during_max_after_first_ms": 1e3 * max(due_during) if due_during else None,
        "after_p50_ms": 1e3 * statistics.median(after[1:]) if len(after) > 1 else None,
        "after_max_ms": 1e3 * max(after[1:]) if len(after) > 1 else None,
    }
    by_phase = _by_phase(rows)
    if by_phase:
        summary["due_during_by_phase"] = by_phase
    later = rows[20:]
    if later:  # calls a tuned backend answered, after the first 20 (variable shapes: the tuned ranges' coverage)
        summary["served_tuned_after_20"] = sum(bool(r.get("served_tuned")) for r in later) / len(later)
    if first_tuned is not None and "launch_to_start_s" in data:
        summary["launch_to_tuned_s"] = data["launch_to_start_s"] + summary["time_to_tuned_s"]
    for key in ("compile_call_s", "setup_s", "launch_to_start_s", "frozen_at_start", "stalls", "long_collections",
                "stderr_lines", "exit_status", "stderr_tail", "backends", "summary", "history",
                "cudagraph_pool_failures", "job_profile"):
        if key in data:
            summary[key] = data[key]
    if eager is not None and "checks" in eager:
        pairs = zip(data["checks"], eager["checks"], strict=True)
        summary["max_abs_diff_vs_eager"] = max(float((a - b).abs().max()) for a, b in pairs)
    return summary


def ratios(rows: dict[str, dict[str, Any]], eager_rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """The acceptance ratios of one workload (None where a run failed or has no such phase). "compile first call"
    is torch.compile's time-to-tuned: its `torch.compile()` line and its first request."""
    eager_p99 = _pct([r["latency_s"] for r in eager_rows], 0.99)
    cold, base = rows["jit-cold"], rows["eager"]
    return {
        "due_during_p99_over_eager": _ratio(cold.get("due_during_p99_ms"), base.get("due_during_p99_ms")),
        "due_during_max_after_first_over_eager_p99": _ratio(cold.get("due_during_max_after_first_ms"),
                                                            base.get("due_during_p99_ms")),
        "gcrefreeze_due_during_p99_over_eager": _ratio(rows["jit-cold-gcrefreeze"].get("due_during_p99_ms"),
                                                       base.get("due_during_p99_ms")),
        "gcpause_due_during_p99_over_eager": _ratio(rows["jit-cold-gcpause"].get("due_during_p99_ms"),
                                                    base.get("due_during_p99_ms")),
        "gcyoung_due_during_p99_over_eager": _ratio(rows["jit-cold-gcyoung"].get("due_during_p99_ms"),
                                                    base.get("due_during_p99_ms")),
        "eager_p50_ms": base.get("during_p50_ms"),
        "eager_p99_ms": 1e3 * eager_p99 if eager_p99 else None,
        "during_p99_over_eager_p99": _ratio(cold.get("during_p99_ms"), 1e3 * eager_p99 if eager_p99 else None),
        "during_max_over_eager_p99": _ratio(cold.get("during_max_ms"), 1e3 * eager_p99 if eager_p99 else None),
        "during_max_after_first_over_eager_p99": _ratio(cold.get("during_max_after_first_ms"),
                                                        1e3 * eager_p99 if eager_p99 else None),
        "thread_during_p99_over_eager_p99": _ratio(rows["jit-cold-thread"].get("during_p99_ms"),
                                                   1e3 * eager_p99 if eager_p99 else None),
        "thread_during_max_over_eager_p99": _ratio(rows["jit-cold-thread"].get("during_max_ms"),
                                                   1e3 * eager_p99 if eager_p99 else None),
        "nostep_during_p99_over_eager_p99": _ratio(rows["jit-cold-nostep"].get("during_p99_ms"),
                                                   1e3 * eager_p99 if eager_p99 else None),
        "nostep_during_max_over_eager_p99": _ratio(rows["jit-cold-nostep"].get("during_max_ms"),
                                                   1e3 * eager_p99 if eager_p99 else None),
        "nostep_time_to_tuned_over_compile_first_call": _ratio(rows["jit-cold-nostep"].get("time_to_tuned_s"),
                                                               rows["compile-cold"].get("time_to_tuned_s")),
        "profile_during_p99_over_eager_p99": _ratio(rows["jit-cold-profile"].get("during_p99_ms"),
                                                    1e3 * eager_p99 if eager_p99 else None),
        "profile_time_to_tuned_over_compile_first_call": _ratio(rows["jit-cold-profile"].get("time_to_tuned_s"),
                                                                rows["compile-cold"].get("time_to_tuned_s")),
        "thread_time_to_tuned_over_compile_first_call": _ratio(rows["jit-cold-thread"].get("time_to_tuned_s"),
                                                               rows["compile-cold"].get("time_to_tuned_s")),
        "cold_time_to_tuned_over_compile_first_call": _ratio(cold.get("time_to_tuned_s"),
                                                             rows["compile-cold"].get("time_to_tuned_s")),
        "warm_over_cold_time_to_tuned": _ratio(rows["jit-warm"].get("time_to_tuned_s"), cold.get("time_to_tuned_s")),
        "warm_time_to_tuned_over_warm_compile_first_call": _ratio(rows["jit-warm"].get("time_to_tuned_s"),
                                                                  rows["compile-warm"].get("time_to_tuned_s")),
        "cold_launch_to_tuned_over_compile": _ratio(cold.get("launch_to_tuned_s"),
                                                    rows["compile-cold"].get("launch_to_tuned_s")),
        "warm_launch_to_tuned_over_cold": _ratio(rows["jit-warm"].get("launch_to_tuned_s"),
                                                 cold.get("launch_to_tuned_s")),
        "warm_launch_to_tuned_over_compile_warm": _ratio(rows["jit-warm"].get("launch_to_tuned_s"),
                                                         rows["compile-warm"].get("launch_to_tuned_s")),
        "warm_over_warm_noprefetch_time_to_tuned": _ratio(rows["jit-warm"].get("time_to_tuned_s"),
                                                          rows["jit-warm-noprefetch"].get("time_to_tuned_s")),
        "warm_over_warm_gated_time_to_tuned": _ratio(rows["jit-warm"].get("time_to_tuned_s"),
                                                     rows["jit-warm-gated"].get("time_to_tuned_s")),
        "warm_over_warm_rebuild_time_to_tuned": _ratio(rows["jit-warm"].get("time_to_tuned_s"),
                                                       rows["jit-warm-rebuild"].get("time_to_tuned_s")),
        "steady_background_over_blocking": _ratio(cold.get("after_p50_ms"), rows["jit-blocking"].get("after_p50_ms")),
        "steady_jit_over_compile": _ratio(cold.get("after_p50_ms"), rows["compile-cold"].get("after_p50_ms")),
        "steady_blocking_over_compile_dynamic": _ratio(rows["jit-blocking"].get("after_p50_ms"),
                                                       rows["compile-dynamic"].get("after_p50_ms")),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _fmt(value: Any, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def print_table(name: str, rows: dict[str, dict[str, Any]], ratio: dict[str, float | None]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{name}: latency while tuning runs (ms), time-to-tuned (s)")
    for column in ("contender", "tuned at s", "from launch s", "first call s", "during p50", "during p99", "during max",
                   "max after 1st", "due p99", "due max after 1st", "after p50", "tuned share", "root", "max |diff|",
                   "exit"):
        table.add_column(column, justify="left" if column in ("contender", "root") else "right")
    for contender, row in rows.items():
        if "error" in row:
            table.add_row(contender, "error: " + row["error"].strip().splitlines()[-1][:60] if row["error"] else "")
            continue
        table.add_row(contender, _fmt(row["time_to_tuned_s"]), _fmt(row.get("launch_to_tuned_s")),
                      _fmt(row["first_call_s"]),
                      _fmt(row["during_p50_ms"]), _fmt(row["during_p99_ms"]), _fmt(row["during_max_ms"]),
                      _fmt(row.get("during_max_after_first_ms")), _fmt(row.get("due_during_p99_ms")),
                      _fmt(row.get("due_during_max_after_first_ms")), _fmt(row["after_p50_ms"], 3),
                      _fmt(row.get("served_tuned_after_20")),
                      str(row["root_state"] or ""),
                      _fmt(row.get("max_abs_diff_vs_eager"), 6) if "max_abs_diff_vs_eager" in row else "-",
                      str(row.get("exit_status", "")))
    console = Console(width=max(Console().width, 160))  # a log file is narrow otherwise
    console.print(table)
    phases = Table(title=f"{name}: latency from the due time while tuning, by the job's step (ms)")
    for column in ("contender", "step", "requests", "p50", "p99", "max"):
        phases.add_column(column, justify="left" if column in ("contender", "step") else "right")
    for contender, row in rows.items():
        for step, figures in (row.get("due_during_by_phase") or {}).items():
            phases.add_row(contender, step, str(figures["count"]), _fmt(figures["p50_ms"]), _fmt(figures["p99_ms"]),
                           _fmt(figures["max_ms"]))
    if phases.row_count:
        console.print(phases)
    profiles = Table(title=f"{name}: where the job's time went (share of the job threads' samples)")
    for column in ("contender", "job s", "category", "share"):
        profiles.add_column(column, justify="left" if column in ("contender", "category") else "right")
    for contender, row in rows.items():
        profile = row.get("job_profile") or {}
        for category, share in (profile.get("by_category") or {}).items():
            profiles.add_row(contender, _fmt(profile.get("seconds")), category, _fmt(share))
    if profiles.row_count:
        console.print(profiles)
    console.print({k: round(v, 3) if isinstance(v, float) else v for k, v in ratio.items()})
