"""The decision store: atomic JSON entries; damaged or edited entries are ignored with one warning each."""

from __future__ import annotations

import json
import logging

import pytest

from aitune_core import decision_store
from aitune_core.decision_store import Decision, DecisionStore

KEY = "ab" * 32


@pytest.fixture(autouse=True)
def _fresh_warnings():
    decision_store._warned.clear()


def _backend(key: str = KEY) -> Decision:
    return Decision(key=key, kind="backend", backend_type="TorchEagerBackend", backend_config={},
                    source="Model.blocks.0", module="Block", graph="0: x float32[2..4,8]", speedup=1.3)


def test_round_trip_and_no_temporary_file_left(tmp_path):
    store = DecisionStore(tmp_path)
    assert store.get(KEY) is None
    path = store.put(_backend())
    assert path == tmp_path / "decisions" / f"{KEY}.json"
    assert store.get(KEY) == _backend().__class__(**{**_backend().to_dict(), "created": store.get(KEY).created})
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    eager = Decision(key="cd" * 32, kind="eager", reason="graph break: x", reopen=True)
    store.put(eager)
    assert store.get(eager.key).reason == "graph break: x"
    assert [d.key for _p, d in store.entries()] == [KEY, eager.key]
    assert store.clear() == 2 and list(store.entries()) == []


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda text: text[: len(text) // 2], "column"),  # truncated: half a file (json says where it broke)
        (lambda text: text.replace("TorchEagerBackend", "TorchInductorBackend"), "checksum"),  # edited content
        (lambda text: "[1, 2]", "not an aitune decision"),
    ],
)
def test_damaged_entries_are_ignored_with_one_warning(tmp_path, caplog, damage, why):
    store = DecisionStore(tmp_path)
    path = store.put(_backend())
    path.write_text(damage(path.read_text()))
    with caplog.at_level(logging.WARNING, logger="aitune.cache"):
        assert store.get(KEY) is None
        assert store.get(KEY) is None
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and why in warnings[0] and "tuned again" in warnings[0]
    assert [d for _p, d in store.entries()] == [None]


def test_an_entry_of_bytes_that_are_not_utf8_is_ignored_with_one_warning(tmp_path, caplog):
    store = DecisionStore(tmp_path)
    path = store.put(_backend())
    path.write_bytes(b"\xff\xfe" + path.read_bytes())
    with caplog.at_level(logging.WARNING, logger="aitune.cache"):
        assert store.get(KEY) is None
        assert store.get(KEY) is None
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "cannot be read" in warnings[0]
    assert [d for _p, d in store.entries()] == [None]


def test_an_entry_under_another_key_is_ignored(tmp_path, caplog):
    """A consistent entry copied (or renamed) to another key's file is not that key's decision."""
    store = DecisionStore(tmp_path)
    path = store.put(_backend())
    other = "ef" * 32
    path.rename(store.path(other))
    with caplog.at_level(logging.WARNING, logger="aitune.cache"):
        assert store.get(other) is None
    assert "not" in caplog.records[0].getMessage()


def test_invalid_decisions_and_keys_are_refused(tmp_path):
    with pytest.raises(ValueError, match="kind"):
        Decision(key=KEY, kind="maybe")
    with pytest.raises(ValueError, match="backend_type"):
        Decision(key=KEY, kind="backend")
    with pytest.raises(ValueError, match="not a decision key"):
        DecisionStore(tmp_path).path("../../etc/passwd")
    payload = json.loads(json.dumps(_backend().to_dict()))
    payload["extra"] = 1
    with pytest.raises(ValueError, match="unknown fields"):
        Decision.from_dict(payload)
    # fields of another type, as an edited entry could carry them: refused when read, not when used
    for field, value in (("speedup", "fast"), ("module", 123), ("validated_samples", True), ("reopen", "yes")):
        edited = {**_backend().to_dict(), field: value}
        with pytest.raises(ValueError, match=f"field '{field}'"):
            Decision.from_dict(edited)


def test_a_package_recorded_later_travels_with_the_decision_and_older_entries_have_none(tmp_path):
    store = DecisionStore(tmp_path)
    store.put(_backend())
    assert store.get(KEY).package is None and store.get(KEY).package_sha256 is None
    decision = store.get(KEY)
    decision.package, decision.package_sha256 = f"{KEY}.pt2", "12" * 32
    store.put(decision)
    assert (store.get(KEY).package, store.get(KEY).package_sha256) == (f"{KEY}.pt2", "12" * 32)
