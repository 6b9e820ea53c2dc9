"""Claims of graphs being tuned: taken once, held against other live processes, taken over when stale."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from aitune_core import tuning_claim
from aitune_core.decision_store import DecisionStore

KEY = "ab" * 32


def _foreign(folder, *, pid=1, host=None, expires_in=600.0, process_start=None):
    """A claim file as another process writes it (pid 1 runs on every Linux host, and is never this process)."""
    path = tuning_claim.claim_path(folder, KEY)
    folder.mkdir(parents=True, exist_ok=True)
    now = time.time()
    path.write_text(json.dumps({"pid": pid, "host": host or tuning_claim.host_id(), "started": now - 3,
                                "expires": now + expires_in, "process_start": process_start}))
    return path


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_free_claim_is_taken_once_and_released(tmp_path):
    assert tuning_claim.take(tmp_path, KEY, 60) is None
    path = tuning_claim.claim_path(tmp_path, KEY)
    holder = tuning_claim.read(path)
    assert holder.pid == os.getpid() and holder.expires > time.time() + 50
    assert path in tuning_claim.held()
    assert tuning_claim.take(tmp_path, KEY, 60) is None  # this process holds it already
    tuning_claim.release(tmp_path, KEY)
    assert not path.exists() and path not in tuning_claim.held()
    assert not [p for p in tmp_path.iterdir()]  # no temporary file left


def test_a_live_process_claim_is_held(tmp_path):
    _foreign(tmp_path)
    holder = tuning_claim.take(tmp_path, KEY, 60)
    assert holder is not None and holder.pid == 1
    assert "process 1 on this host" in holder.describe()
    tuning_claim.release(tmp_path, KEY)  # not ours: left alone
    assert tuning_claim.claim_path(tmp_path, KEY).exists()


@pytest.mark.parametrize("stale", ["dead pid", "expired", "reused pid", "damaged"])
def test_a_stale_claim_is_taken_over(tmp_path, stale):
    if stale == "dead pid":
        path = _foreign(tmp_path, pid=_dead_pid())
    elif stale == "expired":
        path = _foreign(tmp_path, host="another-host", expires_in=-1)
    elif stale == "reused pid":
        if tuning_claim._process_start(1) is None:
            pytest.skip("no /proc here")
        path = _foreign(tmp_path, process_start="1")  # pid 1, but not the process that started at tick 1
    else:
        path = tuning_claim.claim_path(tmp_path, KEY)
        path.write_text("{not json")
        old = time.time() - tuning_claim.FRESH_UNPARSED_S - 5
        os.utime(path, (old, old))
    assert tuning_claim.take(tmp_path, KEY, 60) is None
    assert tuning_claim.read(path).pid == os.getpid()
    tuning_claim.release(tmp_path, KEY)


def test_a_fresh_half_written_claim_counts_as_held_and_another_host_by_its_expiry(tmp_path):
    path = tuning_claim.claim_path(tmp_path, KEY)
    path.write_text("")  # an exclusive create whose writer has not written yet
    holder = tuning_claim.take(tmp_path, KEY, 60)
    assert holder is not None and "being written" in holder.describe()
    assert path.read_text() == ""
    path.unlink()
    _foreign(tmp_path, pid=_dead_pid(), host="another-host")  # its pid means nothing here
    assert tuning_claim.take(tmp_path, KEY, 60).host == "another-host"


def test_release_all_removes_only_this_process_claims(tmp_path):
    assert tuning_claim.take(tmp_path, KEY, 60) is None
    other = "cd" * 32
    tuning_claim.claim_path(tmp_path, other).write_text(json.dumps(
        {"pid": 1, "host": tuning_claim.host_id(), "started": 0, "expires": time.time() + 60}))
    tuning_claim.release_all()
    assert not tuning_claim.claim_path(tmp_path, KEY).exists()
    assert tuning_claim.claim_path(tmp_path, other).exists()


def test_a_folder_that_cannot_hold_claims_does_not_stop_tuning(tmp_path):
    folder = tmp_path / "not-a-folder"
    folder.write_text("a file where the decisions folder should be")
    assert tuning_claim.take(folder, KEY, 60) is None
    assert tuning_claim.held() == []


def test_a_bad_key_is_refused_and_cache_clear_removes_claims(tmp_path):
    with pytest.raises(ValueError):
        tuning_claim.claim_path(tmp_path, "../x")
    store = DecisionStore(tmp_path)
    _foreign(store.folder)
    (store.folder / "notes.claim").write_text("mine")
    store.clear()
    assert [p.name for p in store.folder.iterdir()] == ["notes.claim"]


def test_holder_names_only_another_live_process(tmp_path):
    assert tuning_claim.holder(tmp_path, KEY) is None  # no claim
    assert tuning_claim.take(tmp_path, KEY, 60) is None
    assert tuning_claim.holder(tmp_path, KEY) is None  # this process's own
    tuning_claim.release(tmp_path, KEY)
    _foreign(tmp_path)
    assert tuning_claim.holder(tmp_path, KEY).pid == 1
    _foreign(tmp_path, pid=_dead_pid())
    assert tuning_claim.holder(tmp_path, KEY) is None  # stale


def test_a_claim_that_cannot_be_removed_is_left_and_tuning_goes_on(tmp_path):
    path = tuning_claim.claim_path(tmp_path, KEY)
    path.mkdir()  # a folder of that name (or another user's claim in a sticky folder): not removable
    old = time.time() - tuning_claim.FRESH_UNPARSED_S - 5
    os.utime(path, (old, old))
    assert tuning_claim.take(tmp_path, KEY, 60) is None
    assert tuning_claim.holder(tmp_path, KEY) is None and path.is_dir()
    assert tuning_claim.held() == []


@pytest.mark.parametrize("odd", [{"expires": float("nan")}, {"expires": 1e308}, {"pid": -1}, {"pid": 0}])
def test_a_hand_made_claim_no_process_could_write_is_stale(tmp_path, odd):
    fields = {"pid": 1, "host": tuning_claim.host_id(), "started": time.time(), "expires": time.time() + 600, **odd}
    tuning_claim.claim_path(tmp_path, KEY).write_text(json.dumps(fields))
    assert tuning_claim.take(tmp_path, KEY, 60) is None  # taken over
    tuning_claim.release(tmp_path, KEY)
