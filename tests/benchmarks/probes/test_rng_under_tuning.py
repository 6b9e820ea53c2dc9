"""benchmarks/probes/rng_under_tuning.py: the reference draws repeat after a reseed, and a shifted stream is told."""

from __future__ import annotations

import torch

from benchmarks.probes import rng_under_tuning as probe


def test_a_reseeded_step_draws_its_reference_again_and_a_shifted_one_differs():
    cpu = torch.device("cpu")
    probe._seed(3)
    reference = [probe._draws(cpu) for _ in range(2)]
    probe._seed(3)
    assert [probe._differs(probe._draws(cpu), want) for want in reference] == [[], []]
    probe._seed(3)
    torch.rand(1)  # (a draw the program did not make: the CPU stream is shifted from here on)
    assert "cpu_rand" in probe._differs(probe._draws(cpu), reference[0])


def test_aitunes_thread_stacks_are_named_and_short():
    import threading

    started, stop = threading.Event(), threading.Event()

    def body() -> None:
        started.set()
        stop.wait(5)

    thread = threading.Thread(target=body, name="aitune-tuning-job-test")
    thread.start()
    started.wait(5)
    try:
        stacks = probe._aitune_stacks()
        assert "aitune-tuning-job-test" in stacks
        assert 0 < len(stacks["aitune-tuning-job-test"]) <= probe.STACK_DEPTH
    finally:
        stop.set()
        thread.join(5)
