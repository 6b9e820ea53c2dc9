"""Identical siblings tuned once, decisions reused by a later run, and unusable decisions tuned again."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time

import torch
from jit_helpers import CountingBackend, RaisingBackend, make_mlp, run

from aitune_core.decision_store import Decision, DecisionStore
from aitune_jit import decisions
from aitune_jit.config import jit_config
from aitune_jit.patched_module import PatchedModule
from aitune_jit.state import NodeState
from aitune_jit.switch import disable, enable


def _siblings_only():
    """The root is skipped, so its blocks (identical) are the candidates; blocks are tuned, not their layers."""
    jit_config.backends = [CountingBackend()]
    jit_config.detect_graph_breaks = False
    jit_config.min_parameters = 0
    jit_config.skip_modules = ["MLP", "Sequential"]


def _tunings(name: str) -> list[str]:
    return [h for h in PatchedModule.history if h.startswith(f"Tuning {name}")]


def test_identical_siblings_are_tuned_once_and_reuse_the_decision():
    _siblings_only()
    model = make_mlp(blocks=4)
    reference = run(make_mlp(blocks=4), [2, 3, 4, 5])
    enable()
    outputs = run(model, [2, 3, 4, 5])
    for out, ref in zip(outputs, reference):
        torch.testing.assert_close(out, ref)
    blocks = [PatchedModule.of(block) for block in model.blocks]
    assert all(node.state is NodeState.TUNED for node in blocks)
    assert len(_tunings("Block")) == 1  # only the first block ran the strategy
    reused = [h for h in PatchedModule.history if "reused the decision of MLP.blocks.0:" in h]
    assert len(reused) == 3
    # one build per block (the chosen backend only, validated on the block's own samples), one for the head
    assert CountingBackend.builds == 4 + 1


def _count_free_rebuilds(monkeypatch) -> list[int]:
    """Counts the rebuilds that `decisions.reuse` runs with the job's gate off (`warm_rebuild_gate.running_freely`)."""
    entered = []

    @contextlib.contextmanager
    def counting(device_type):
        entered.append(device_type)
        yield

    monkeypatch.setattr(decisions, "running_freely", counting)
    return entered


def test_a_sibling_rebuild_keeps_stepping_aside(monkeypatch):
    entered = _count_free_rebuilds(monkeypatch)
    _siblings_only()
    enable()
    run(make_mlp(blocks=3), [2, 3, 4])
    assert sum("reused the decision of MLP.blocks.0:" in h for h in PatchedModule.history) == 2
    assert entered == []  # (its compile may be a new one: the kernels of this process's decision may not fit it)


def test_a_later_run_reuses_the_stored_decision(tmp_path, monkeypatch):
    entered = _count_free_rebuilds(monkeypatch)
    _siblings_only()
    enable()
    run(make_mlp(blocks=2), [2, 3, 4])
    disable()
    stored = sorted(d.module.split()[0] for _p, d in DecisionStore(jit_config.cache_dir).entries())
    assert stored == ["Block", "Linear"]  # one per distinct module (the head is a Linear), not per block
    decisions.reset()  # a new process: nothing in memory, the store on disk
    PatchedModule.clear_history()
    enable()
    model = make_mlp(blocks=2)
    run(model, [2, 3, 4])
    assert _tunings("Block") == []
    assert all(PatchedModule.of(b).state is NodeState.TUNED for b in model.blocks)
    assert any("reused the decision of MLP.blocks.0 from the cache" in h for h in PatchedModule.history)
    assert entered == ["cpu", "cpu"]  # the first block and the head: read from the store (the second block reuses the
    # first one's, now in memory)


def _store_edited_block_decision(**changes: object) -> None:
    """Tune a one-block MLP's block, store its decision with `changes` (as an editor of the cache folder would),
    and start again as a new process: nothing in memory, the history empty, the hook on."""
    _siblings_only()
    enable()
    run(make_mlp(blocks=1), [2, 3])
    disable()
    store = DecisionStore(jit_config.cache_dir)
    stored = next(d for _p, d in store.entries() if d.module.startswith("Block"))
    store.put(Decision(**{**stored.to_dict(), **changes}))
    decisions.reset()
    PatchedModule.clear_history()
    enable()


def test_a_decision_that_does_not_hold_here_is_tuned_again(caplog):
    """A stored decision whose backend fails to build for this module: normal tuning, outputs unchanged."""
    _store_edited_block_decision(backend_type="RaisingBackend", backend_description="raising",
                                 backend_path=f"{RaisingBackend.__module__}.{RaisingBackend.__qualname__}")
    model = make_mlp(blocks=1)
    outputs = run(model, [2, 3, 4])
    torch.testing.assert_close(outputs, run(make_mlp(blocks=1), [2, 3, 4]))
    assert any("does not hold here" in h for h in PatchedModule.history)
    assert len(_tunings("Block")) == 1 and PatchedModule.of(model.blocks[0]).state is NodeState.TUNED


def test_a_damaged_entry_is_ignored_with_a_warning_and_tuned_again(caplog):
    _siblings_only()
    enable()
    run(make_mlp(blocks=1), [2, 3])
    disable()
    path = next(p for p, d in DecisionStore(jit_config.cache_dir).entries() if d.module.startswith("Block"))
    path.write_text(path.read_text()[:40])
    decisions.reset()
    PatchedModule.clear_history()
    enable()
    model = make_mlp(blocks=1)
    with caplog.at_level(logging.WARNING, logger="aitune.cache"):
        run(model, [2, 3, 4])
    assert any("Ignoring aitune cache entry" in r.getMessage() for r in caplog.records)
    assert len(_tunings("Block")) == 1 and PatchedModule.of(model.blocks[0]).state is NodeState.TUNED


def test_reuse_can_be_switched_off():
    _siblings_only()
    jit_config.reuse_decisions = False
    enable()
    run(make_mlp(blocks=3), [2, 3])
    assert len(_tunings("Block")) == 3
    assert not (jit_config.cache_dir / "decisions").exists()


def test_the_decided_class_is_found_by_its_full_name_not_only_its_name():
    """Two backend classes called CountingBackend (the core tests have one too): the decision names its own."""
    from aitune_core.backends.backend import Backend

    class CountingBackend(Backend):  # same name, another class
        def _build(self, module, graph_spec, data, cache_dir):
            raise AssertionError("the other class was used")

        def _infer(self, *args, **kwargs):  # pragma: no cover
            raise AssertionError

    _siblings_only()
    enable()
    run(make_mlp(blocks=3), [2, 3])
    assert len(_tunings("Block")) == 1
    assert sum("reused the decision of MLP.blocks.0:" in h for h in PatchedModule.history) == 2
    assert CountingBackend.__name__ == "CountingBackend"


def test_a_speed_verdict_is_shared_by_siblings_but_not_stored():
    """"No backend is faster" depends on the machine's load at that moment: siblings share it, the store keeps
    nothing (a later process measures again)."""
    from aitune_core.errors import NotFasterThanEagerError
    from aitune_core.strategies.strategy import TuneStrategy

    class NeverFaster(TuneStrategy):
        calls = 0

        def _tune(self, module, name, graph_spec, data, device, cache_dir):
            NeverFaster.calls += 1
            raise NotFasterThanEagerError(f"no backend is at least 1.05x faster than eager for module `{name}`")

    _siblings_only()
    jit_config.strategy = NeverFaster([CountingBackend()])
    jit_config.skip_modules = ["MLP", "Sequential", "Linear", "LayerNorm", "ReLU"]
    reference = run(make_mlp(blocks=3), [2, 3])
    enable()
    model = make_mlp(blocks=3)
    torch.testing.assert_close(run(model, [2, 3]), reference)
    assert NeverFaster.calls == 1
    assert sum("reused the decision of MLP.blocks.0)" in h for h in PatchedModule.history) == 2
    assert list(DecisionStore(jit_config.cache_dir).entries()) == []
    sibling = PatchedModule.of(model.blocks[2])  # its reason names itself, the decision's source follows
    assert "`MLP.blocks.2`" in sibling.reason and "`MLP.blocks.0`" not in sibling.reason, sibling.reason



def test_a_failure_in_a_process_that_turns_warnings_into_errors_is_not_stored():
    """Under `-W error` a compile fails on a deprecation warning of torch's own: siblings of this process share
    the verdict, the store keeps nothing (it kept the module eager in every later process)."""
    import warnings

    from aitune_core.errors import TuningFailedError
    from aitune_core.strategies.strategy import TuneStrategy

    class WarnsAsError(TuneStrategy):
        calls = 0

        def _tune(self, module, name, graph_spec, data, device, cache_dir):
            WarnsAsError.calls += 1
            raise TuningFailedError("DeprecationWarning: `torch.jit.script_method` is deprecated")

    _siblings_only()
    jit_config.strategy = WarnsAsError([CountingBackend()])
    jit_config.skip_modules = ["MLP", "Sequential", "Linear", "LayerNorm", "ReLU"]
    enable()
    model = make_mlp(blocks=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        run(model, [2, 3])
    assert WarnsAsError.calls == 1 and list(DecisionStore(jit_config.cache_dir).entries()) == []
    assert PatchedModule.of(model.blocks[2]).state is NodeState.EAGER


_fast = threading.local()


class _SlowBlock(torch.nn.Module):
    """Sleeps 2 ms per call unless `_FastBackend` runs it: a backend that deterministically wins a measurement."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not getattr(_fast, "on", False):
            time.sleep(0.002)
        return torch.relu(self.linear(x))


class _Stack(torch.nn.Module):
    def __init__(self, blocks: int) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_SlowBlock() for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class _FastBackend(CountingBackend):
    def _infer(self, *args, **kwargs):
        _fast.on = True
        try:
            return super()._infer(*args, **kwargs)
        finally:
            _fast.on = False


def _measured_tuning(monkeypatch, tmp_path, blocks: int) -> dict[str, int]:
    """Tune a stack of `blocks` identical blocks (the root skipped) with a measuring strategy and the
    graph-break probe on; what it cost in probes, measurements, strategy runs and builds."""
    from aitune_core import profiling
    from aitune_core.strategies.highest_throughput import HighestThroughputStrategy

    counts = {"measurements": 0}

    def counted(function):
        def wrapper(*args, **kwargs):
            counts["measurements"] += 1
            return function(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(profiling, "profile", counted(profiling.profile))
    monkeypatch.setattr(profiling, "compare", counted(profiling.compare))
    jit_config.cache_dir = tmp_path / f"cache-{blocks}"  # a fresh process: nothing stored yet
    jit_config.min_parameters = 0
    jit_config.skip_modules = ["_Stack"]
    jit_config.strategy = HighestThroughputStrategy(
        [CountingBackend(), _FastBackend()], profile_at_recorded_shapes=True, min_speedup=1.2, warmup=1,
        iterations=3, budget_s=0.05,
    )
    CountingBackend.reset_counts()
    PatchedModule.clear_history()
    decisions.reset()
    model = _Stack(blocks).eval()
    enable()
    with torch.no_grad():
        for batch in (2, 3, 4, 5):
            model(torch.randn(batch, 8))
    assert all(PatchedModule.of(block).state is NodeState.TUNED for block in model.blocks)
    disable()
    return {**counts, "builds": CountingBackend.builds, "strategy_runs": len(_tunings("_SlowBlock")),
            "probes": sum(h.startswith(("No graph breaks in _SlowBlock", "Graph breaks in _SlowBlock"))
                          for h in PatchedModule.history),
            "reused": sum("reused the decision of _Stack.blocks.0:" in h for h in PatchedModule.history)}


def test_a_sibling_reusing_a_decision_is_not_probed_or_measured_again(monkeypatch, tmp_path):
    """The siblings of a measured block skip the graph-break probe, the losing candidate and every
    measurement: 4 identical blocks cost the measurements of 1, plus one build of the chosen backend each."""
    one = _measured_tuning(monkeypatch, tmp_path, blocks=1)
    four = _measured_tuning(monkeypatch, tmp_path, blocks=4)
    assert one["measurements"] > 0 and one["strategy_runs"] == 1 and one["probes"] == 1
    assert one["builds"] == 2  # both candidates were built and measured for the first block
    assert four["measurements"] == one["measurements"]
    assert four["strategy_runs"] == 1 and four["probes"] == 1 and four["reused"] == 3
    assert four["builds"] == one["builds"] + 3  # the siblings build the chosen backend only


def test_inductors_cache_folder_goes_under_the_cache_dir_and_follows_it_unless_someone_chose_one(
        monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "-")  # (restored after the test)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.setattr(decisions, "_pointed", None)
    monkeypatch.setattr(jit_config, "cache_dir", str(tmp_path / "a"))
    decisions.point_inductor_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "a" / "inductor")
    monkeypatch.setattr(jit_config, "cache_dir", str(tmp_path / "b"))  # set by the script after start-up
    decisions.point_inductor_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "b" / "inductor")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "theirs")  # the program's own choice is kept
    decisions.point_inductor_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "theirs")


def test_a_cache_folder_with_a_space_leaves_inductors_folder_at_its_default_with_one_warning(
        monkeypatch, tmp_path, caplog):
    # Inductor's C++ builds pass the folder unquoted: every CPU build failed there, and the failure was stored
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "-")  # (restored after the test)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.setattr(decisions, "_pointed", None)
    monkeypatch.setattr(decisions, "_unpointed_warned", False)
    monkeypatch.setattr(jit_config, "cache_dir", str(tmp_path / "with space"))
    with caplog.at_level(logging.WARNING, logger="aitune.jit"):
        decisions.point_inductor_cache()
        decisions.point_inductor_cache()
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    warned = [r for r in caplog.records if "has a space in its path" in r.getMessage()]
    assert len(warned) == 1


def test_an_entry_edited_to_set_a_program_for_inductor_is_refused_with_a_warning(caplog):
    """A decision in a shared cache folder, edited (checksum recomputed) to name Inductor's C++ compiler: the
    configuration is refused before anything is built, with one WARNING, and the graph is tuned normally."""
    from aitune_core.backends.torch_inductor import TorchInductorBackend

    _store_edited_block_decision(
        backend_type="TorchInductorBackend", backend_description="edited",
        backend_path=f"{TorchInductorBackend.__module__}.{TorchInductorBackend.__qualname__}",
        backend_config={"options": {"cpp.cxx": "/tmp/not-a-compiler.sh"}})
    model = make_mlp(blocks=1)
    with caplog.at_level(logging.WARNING, logger="aitune"):
        torch.testing.assert_close(run(model, [2, 3, 4]), run(make_mlp(blocks=1), [2, 3, 4]))
    refused = [r.getMessage() for r in caplog.records if "refused the decision" in r.getMessage()]
    assert len(refused) == 1 and "'cpp.cxx' is not accepted from a file" in refused[0]
    assert len(_tunings("Block")) == 1


def test_an_entry_edited_to_run_in_reduced_precision_is_refused_where_full_precision_is_asked(caplog):
    """A decision edited (checksum recomputed) to run an fp32 program's module under bf16 autocast: refused
    before anything is built, with one WARNING; the module is tuned normally and answers in fp32."""
    from aitune_core.backends.torch_inductor import TorchInductorBackend

    _store_edited_block_decision(
        backend_type="TorchInductorBackend", backend_description="edited",
        backend_path=f"{TorchInductorBackend.__module__}.{TorchInductorBackend.__qualname__}",
        backend_config={"autocast_enabled": True, "autocast_dtype": "torch.bfloat16"})
    assert jit_config.precision is None
    model = make_mlp(blocks=1)
    with caplog.at_level(logging.WARNING, logger="aitune"):
        torch.testing.assert_close(run(model, [2, 3, 4]), run(make_mlp(blocks=1), [2, 3, 4]))
    refused = [r.getMessage() for r in caplog.records if "refused the decision" in r.getMessage()]
    assert len(refused) == 1 and "autocast (torch.bfloat16)" in refused[0], refused
    assert len(_tunings("Block")) == 1


def test_the_cache_listing_names_a_graph_s_autocast_state():
    from aitune_core.recording.graph_recorder import GraphRecorder
    from aitune_jit.decisions import graph_label

    model = torch.nn.Linear(4, 4)
    recorder = GraphRecorder(model.forward)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        x = torch.randn(2, 4)
        spec = recorder.record((x,), {}, model(x))
    assert graph_label(spec) == "0: input float32[2,4] (autocast cpu bfloat16)"
