"""Tuning claims: a file that tells processes sharing a cache folder "this process is tuning this graph".

Why: replicas of a server that start together with one cache folder each tuned every module: the store only
lets a later process reuse what an earlier one finished. A process about to tune a graph whose decision is not
stored takes the graph's claim first (`take`); a process that finds the claim held by another live process
serves that graph eagerly and looks again later (`aitune_jit.replica_claims`), so the first one tunes, publishes
its decision, and the others reuse it.

    decisions/<key>.claim    {"pid", "host", "started", "expires", "process_start"} as JSON

- Taken atomically: the claim is written whole to a temporary file and hard-linked to its name, which fails when
  the name exists, so no reader sees half a claim (a file system without hard links gets an exclusive create
  instead, and a claim that does not parse yet counts as held for `FRESH_UNPARSED_S`).
- Never held for good: a claim whose `expires` has passed, or whose process is gone (same host: the pid is not
  running, or runs a process started at another time), is stale and may be taken over. The holder removes its
  claims when its job ends (`release`) and at exit (`release_all`).
- Nothing in a claim is executed; a damaged claim is only ever stale.
- Two processes that take over the same stale claim at the same moment may both tune; both results are valid and
  the later one published is kept (`DecisionStore.put` replaces atomically).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import math
import os
import socket
import tempfile
import threading
import time
from pathlib import Path

CLAIM_SUFFIX = ".claim"
#: a claim file that does not parse (yet) counts as held while it is younger than this (seconds)
FRESH_UNPARSED_S = 10.0
#: no claim aitune writes lives longer than this (seconds); one that says so is stale
LONGEST_LIFETIME_S = 7 * 24 * 3600.0

_owned: set[Path] = set()
_owned_lock = threading.Lock()


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a claim (read from its file)."""

    pid: int
    host: str
    started: float
    expires: float
    process_start: str | None = None

    def describe(self, now: float | None = None) -> str:
        age = max(0.0, (time.time() if now is None else now) - self.started)
        if not self.pid:
            return f"another process (its claim is being written, {age:.0f}s ago)"
        where = "this host" if self.host == host_id() else f"host {self.host}"
        return f"process {self.pid} on {where} (claimed {age:.0f}s ago)"


def host_id() -> str:
    """The host name and, where Linux has one, the pid namespace: two containers with one host name but their own
    pids must not judge each other's pids."""
    namespace = ""
    with contextlib.suppress(OSError):
        namespace = ":" + os.readlink("/proc/self/ns/pid")
    return socket.gethostname() + namespace


def _process_start(pid: int) -> str | None:
    """When process `pid` started (Linux: field 22 of /proc/<pid>/stat, clock ticks since boot), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return fields[19] if len(fields) > 19 else None


def _alive(holder: Holder) -> bool:
    """Whether a claim's process still runs (only answerable on its own host, and on POSIX: on Windows `os.kill`
    with signal 0 would send Ctrl-C; elsewhere its expiry decides)."""
    if holder.host != host_id() or os.name != "posix":
        return True
    try:
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (another user's process: it exists)
        pass
    except OSError:
        return True
    started = _process_start(holder.pid)
    return holder.process_start is None or started is None or started == holder.process_start


def claim_path(decisions_folder: Path, key: str) -> Path:
    if not key or not all(c in "0123456789abcdef" for c in key):
        raise ValueError(f"not a decision key: {key!r}")
    return decisions_folder / f"{key}{CLAIM_SUFFIX}"


def read(path: Path) -> Holder | None:
    """The claim at `path` (None when there is none, or it does not parse)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Holder(pid=int(data["pid"]), host=str(data["host"]), started=float(data["started"]),
                      expires=float(data["expires"]), process_start=data.get("process_start"))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def _stale(path: Path, holder: Holder | None, now: float) -> bool:
    """Whether a claim may be taken over. A claim no process could have written (no expiry within
    `LONGEST_LIFETIME_S` of its start, a pid that is no process's) is stale too: only a hand-made file has one, and
    it must not keep replicas waiting for good."""
    if holder is None:
        try:
            return now - path.stat().st_mtime > FRESH_UNPARSED_S
        except FileNotFoundError:
            return True
    if holder.pid <= 0 or not (math.isfinite(holder.expires) and math.isfinite(holder.started)) or (
            holder.expires - holder.started > LONGEST_LIFETIME_S):
        return True
    return holder.expires < now or not _alive(holder)


def _ours(holder: Holder | None) -> bool:
    return holder is not None and holder.pid == os.getpid() and holder.host == host_id()


def take(decisions_folder: Path, key: str, lifetime_s: float) -> Holder | None:
    """Claim graph `key` for this process for at most `lifetime_s` seconds. Returns None when this process holds
    the claim now (taken, taken over from a stale one, or held already), else the live holder. An error of the file
    system (read-only folder) returns None: tuning goes on as without claims."""
    path = claim_path(decisions_folder, key)
    now = time.time()
    payload = {"pid": os.getpid(), "host": host_id(), "started": now, "expires": now + lifetime_s,
               "process_start": _process_start(os.getpid())}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    for _attempt in range(2):
        try:
            _create(path, json.dumps(payload))
        except FileExistsError:
            holder = read(path)
            if _ours(holder):
                return None
            try:
                if not _stale(path, holder, now):
                    return holder or _unparsed(path, now)
                path.unlink()  # a stale claim: taken over on the next attempt
            except FileNotFoundError:
                pass
            except OSError:  # (not removable here: a folder of that name, another user's file in a sticky folder)
                return None
            continue
        except OSError:
            return None
        with _owned_lock:
            _owned.add(path)
        return None
    return read(path) or _unparsed(path, now)


def _unparsed(path: Path, now: float) -> Holder:
    """A claim being written (it does not parse yet): held by a process not known yet."""
    try:
        started = path.stat().st_mtime
    except OSError:
        started = now
    return Holder(pid=0, host="an unknown host", started=started, expires=started + FRESH_UNPARSED_S)


def holder(decisions_folder: Path, key: str) -> Holder | None:
    """The live process other than this one that holds the claim of `key`, or None (no claim, or a stale one)."""
    path = claim_path(decisions_folder, key)
    if not path.exists():
        return None
    found = read(path)
    try:
        if _ours(found) or _stale(path, found, time.time()):
            return None
    except OSError:
        return None
    return found or _unparsed(path, time.time())


def _create(path: Path, text: str) -> None:
    """Create `path` holding `text`, or raise FileExistsError; readers see the whole text or no file."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem[:16]}.", suffix=".claim.tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise
        except OSError:  # no hard links here: an exclusive create (a reader may see it empty for a moment)
            with open(path, "x", encoding="utf-8") as handle:
                handle.write(text)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def release(decisions_folder: Path, key: str) -> None:
    """Remove this process's claim of `key` (another process's claim, taken over meanwhile, is left alone)."""
    path = claim_path(decisions_folder, key)
    with _owned_lock:
        _owned.discard(path)
    if _ours(read(path)):
        with contextlib.suppress(OSError):
            path.unlink()


def release_all() -> None:
    """Remove every claim this process still holds (at exit: a killed job must not keep replicas waiting)."""
    with _owned_lock:
        paths = list(_owned)
        _owned.clear()
    for path in paths:
        if _ours(read(path)):
            with contextlib.suppress(OSError):
                path.unlink()


def held() -> list[Path]:
    """The claim files this process holds now."""
    with _owned_lock:
        return sorted(_owned)


atexit.register(release_all)
