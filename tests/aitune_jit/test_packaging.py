"""Warm starts from packages (precompiled functions, AOTInductor packages): a tuned graph gets a package in the
background, a later run serves it from the package at once and upgrades to the decided backend; a damaged package
is ignored with one warning."""

from __future__ import annotations

import logging

import pytest
import torch
from jit_helpers import CountingBackend, make_mlp, run

from aitune_core.backends.aoti_package import file_sha256
from aitune_core.decision_store import Decision, DecisionStore
from aitune_jit import decisions, packaging
from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.state import NodeState
from aitune_jit.switch import disable, enable
from aitune_jit.worker import wait_until_tuned

BATCHES = [2, 3, 4]


#: AITUNE_WORKER_PACKAGE -> (what the history calls such a package, its backend, its file suffix)
KINDS = {"on": ("precompiled package", "PrecompiledBackend", ".aotc"),
         "aoti": ("AOTInductor package", "AOTIPackageBackend", ".pt2")}


def _background(monkeypatch, kind: str = "on") -> None:
    monkeypatch.setenv("AITUNE_WORKER_PACKAGE", kind)
    jit_config.blocking = False
    jit_config.backends = [CountingBackend()]  # the decision; the package is made of the module whatever it is
    jit_config.detect_graph_breaks = False


def _history(text: str) -> list[str]:
    return [line for line in PatchedModule.history if text in line]


def _new_process() -> None:
    disable()
    decisions.reset()  # nothing in memory: the store on disk
    PatchedModule.clear_history()


def _serve(model: torch.nn.Module) -> None:
    """Serve `model` under the JIT until tuned, then check its outputs against the eager model's."""
    reference = run(make_mlp(), BATCHES, seed=5)  # before the hook is on: plain eager
    enable()
    run(model, BATCHES)
    assert wait_until_tuned(timeout=240)
    for out, ref in zip(run(model, BATCHES, seed=5), reference):
        torch.testing.assert_close(out, ref)


def test_packaging_is_opt_in_and_never_when_blocking(monkeypatch, caplog):
    monkeypatch.delenv("AITUNE_WORKER_PACKAGE", raising=False)
    jit_config.blocking = False
    assert not packaging.enabled(torch.device("cuda")) and not packaging.enabled(torch.device("cpu"))
    monkeypatch.setenv("AITUNE_WORKER_PACKAGE", "on")
    assert packaging.enabled(torch.device("cpu")) and packaging.enabled(torch.device("cuda"))
    assert packaging.kind() == "dynamo"
    monkeypatch.setenv("AITUNE_WORKER_PACKAGE", "aoti")
    assert packaging.kind() == "aoti" and packaging.enabled(torch.device("cpu"))
    monkeypatch.setenv("AITUNE_WORKER_PACKAGE", "maybe")  # a wrong value: one warning, the default
    with caplog.at_level(logging.WARNING, logger="aitune.jit"):
        assert not packaging.enabled(torch.device("cpu"))
    assert any("AITUNE_WORKER_PACKAGE" in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("AITUNE_WORKER_PACKAGE", "on")
    jit_config.blocking = True
    assert not packaging.enabled(torch.device("cpu"))


def test_a_decision_may_only_name_its_own_package_file():
    decision = Decision(key="ab" * 32, kind="backend", backend_type="X", backend_config={},
                        package="../elsewhere.pt2", package_sha256="00")
    assert packaging.package_path(decision) is None
    decision.package = f"{decision.key}.pt2"
    assert packaging.package_path(decision).name == decision.package
    decision.package = f"{decision.key}.1-ab.aotc"
    assert packaging.package_path(decision).name == decision.package and packaging.label(decision).startswith("pre")
    decision.package = f"{decision.key}.1-ab.py"  # not a package kind
    assert packaging.package_path(decision) is None
    decision.package_sha256 = None
    assert packaging.package_path(decision) is None


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_later_run_warm_starts_from_the_package_then_upgrades(monkeypatch, caplog, kind):
    what, backend_name, suffix = KINDS[kind]
    _background(monkeypatch, kind)
    _serve(make_mlp())
    made = _history(f"{what} for warm starts made")
    assert len(made) == 1, PatchedModule.history
    (decision,) = [d for _path, d in DecisionStore(jit_config.cache_dir).entries()]
    path = packaging.package_path(decision)
    assert path is not None and file_sha256(path) == decision.package_sha256
    assert path.name.startswith(f"{decision.key}.") and path.name != f"{decision.key}{suffix}"  # a name per build
    assert path.suffix == suffix

    _new_process()
    builds = CountingBackend.builds
    model = make_mlp()
    _serve(model)
    assert len(_history(f"warm start from the {what}")) == 1, PatchedModule.history
    assert len(_history("reused the decision")) == 1  # the upgrade to the decided backend
    node = PatchedModule.of(model)
    assert node.state is NodeState.TUNED and [b.name for b in node.backends] == ["CountingBackend"]
    assert CountingBackend.builds == builds + 1 and not _history("package for warm starts made")

    _new_process()  # the decided backend cannot be built here: the package keeps serving, nothing is stored
    monkeypatch.setattr(CountingBackend, "_build", lambda *a: (_ for _ in ()).throw(RuntimeError("no such device")))
    model = make_mlp()
    _serve(model)
    assert [b.name for b in PatchedModule.of(model).backends] == [backend_name]
    assert len(_history("the package keeps serving it")) == 1
    (kept,) = [d for _path, d in DecisionStore(jit_config.cache_dir).entries()]
    assert kept.kind == "backend" and kept.package == decision.package
    monkeypatch.undo()
    _background(monkeypatch, kind)

    path.write_bytes(path.read_bytes()[:1000])  # a damaged package: ignored, the decision built as before
    _new_process()
    with caplog.at_level(logging.WARNING, logger="aitune.jit"):
        _serve(make_mlp())
    assert any(f"ignoring the {what}" in r.getMessage() and "SHA-256" in r.getMessage()
               for r in caplog.records)
    assert not _history("warm start from") and len(_history("reused the decision")) == 1


def test_a_missing_package_is_ignored_and_the_decision_is_built(monkeypatch, caplog):
    _background(monkeypatch)
    monkeypatch.setenv("AITUNE_WORKER_PACKAGE", "off")  # tune and store, no package
    _serve(make_mlp())
    store = DecisionStore(jit_config.cache_dir)
    (decision,) = [d for _path, d in store.entries()]
    decision.package, decision.package_sha256 = f"{decision.key}.pt2", "0" * 64  # names a file nobody made
    store.put(decision)
    monkeypatch.setenv("AITUNE_WORKER_PACKAGE", "on")
    monkeypatch.setattr(packaging, "make_next", lambda *a: pytest.fail("the decision already names a package"))
    _new_process()
    with caplog.at_level(logging.WARNING, logger="aitune.jit"):
        _serve(make_mlp())
    assert any("no package at" in r.getMessage() for r in caplog.records)
    assert len(_history("reused the decision")) == 1


def test_a_job_that_settles_nothing_it_owes_ends_the_follow_ups_instead_of_queueing_forever(monkeypatch):
    """A warm-started graph owes an upgrade, and the tuning budget is spent (by other modules): the job returns
    without tuning; the node must not be queued again and again."""
    from aitune_jit import worker
    from aitune_jit.node_transitions import NodeTransitions
    from aitune_jit.tuning_budget import budget

    _background(monkeypatch)
    monkeypatch.setenv("AITUNE_WORKER_PACKAGE", "off")
    model = make_mlp()
    _serve(model)
    node = PatchedModule.of(model)
    node._follow.upgrade.add(node._entries[0][0].name)
    jit_config.tuning_budget_s = 1.0
    monkeypatch.setattr(budget, "spent_s", 5.0)
    worker.submit(node, NodeTransitions._tune_queued)
    assert wait_until_tuned(timeout=10)
    assert not node._follow.pending() and node.state is NodeState.TUNED and not node._tuning
