"""aitune_jit/job_rng.py: a tuning job's thread never puts the program's random states back; other threads do as
torch and Python do; the patches come off exactly; importing rich does not move Python's random stream."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from aitune_jit import job_rng

SCRIPT = Path(__file__).parent / "scripts" / "random_streams.py"


@pytest.fixture
def patched():
    job_rng.install()
    yield
    job_rng.uninstall()


def test_a_restore_on_a_job_thread_is_skipped_and_elsewhere_it_is_not(patched):
    torch.manual_seed(0)
    random.seed(0)
    saved_torch, saved_python = torch.get_rng_state(), random.getstate()
    torch.rand(3), random.random()  # the program draws: the streams move on
    moved_torch, moved_python = torch.get_rng_state(), random.getstate()

    def job() -> None:
        with job_rng.on_job_thread():
            assert job_rng.skipped_here()
            torch.set_rng_state(saved_torch)  # what dynamo does at the end of a compile
            torch.random.set_rng_state(saved_torch)
            random.setstate(saved_python)

    thread = threading.Thread(target=job)
    thread.start()
    thread.join()
    assert torch.equal(torch.get_rng_state(), moved_torch) and random.getstate() == moved_python  # not rewound
    assert not job_rng.skipped_here()
    torch.set_rng_state(saved_torch)  # the program's own restore still works
    random.setstate(saved_python)
    assert torch.equal(torch.get_rng_state(), saved_torch) and random.getstate() == saved_python


def test_install_is_idempotent_and_uninstall_puts_the_originals_back():
    originals = (torch.set_rng_state, torch.random.set_rng_state, random.setstate, torch.cuda.set_rng_state)
    job_rng.install()
    job_rng.install()
    try:
        assert job_rng.installed() and torch.set_rng_state is not originals[0] and random.setstate is not originals[2]
    finally:
        job_rng.uninstall()
    assert not job_rng.installed()
    assert (torch.set_rng_state, torch.random.set_rng_state, random.setstate, torch.cuda.set_rng_state) == originals


def test_preloading_rich_leaves_pythons_random_stream_where_it_was(monkeypatch):
    for name in [n for n in sys.modules if n == "rich" or n.startswith("rich.")]:
        monkeypatch.delitem(sys.modules, name)
    random.seed(5)
    expected = random.Random(5).random()
    job_rng.preload_rich()
    assert "rich.style" in sys.modules and random.random() == expected


def _streams(cache: Path | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AITUNE_JIT_")}
    env.pop("AUTOWRAPT_BOOTSTRAP", None)
    env["OMP_NUM_THREADS"] = "1"
    if cache is not None:
        env.update(AUTOWRAPT_BOOTSTRAP="aitune_enable_jit_tuning", AITUNE_JIT_CACHE_DIR=str(cache),
                   AITUNE_JIT_BACKENDS="TorchInductorBackend")
    result = subprocess.run([sys.executable, str(SCRIPT), "--calls", "800"], env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("RANDOM-STREAMS "))
    return json.loads(line.removeprefix("RANDOM-STREAMS "))


@pytest.mark.slow
def test_a_program_drawing_while_a_job_compiles_draws_what_it_draws_without_aitune(tmp_path):
    plain = _streams(None)
    tuned = _streams(tmp_path / "cache")
    assert "tuned" in tuned["state"].split(","), tuned  # a compile ran on the job thread while the program drew
    # Before job_rng, dynamo's restores at the end of the job's compiles took back what the program had drawn
    # meanwhile: 145 of 800 torch draws and 154 Python draws repeated in this script.
    assert tuned["torch_repeats"] == plain["torch_repeats"] == 0
    assert tuned["python_repeats"] == plain["python_repeats"] == 0
    assert tuned["torch_sum"] == plain["torch_sum"] and tuned["python_sum"] == plain["python_sum"]


def test_a_job_thread_does_not_put_back_the_default_dtype_or_deterministic_flag(patched):
    # dynamo restores both when a compile ends: a program that switched them meanwhile had the switch undone
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_default_dtype(torch.float64)  # the program's change, made while the job compiled
    try:
        def dynamo_restore() -> None:
            with job_rng.on_job_thread():
                torch.set_default_dtype(torch.float32)
                torch.use_deterministic_algorithms(not was_deterministic)

        thread = threading.Thread(target=dynamo_restore)
        thread.start()
        thread.join()
        assert torch.get_default_dtype() is torch.float64
        assert torch.are_deterministic_algorithms_enabled() is was_deterministic
        torch.set_default_dtype(torch.float32)  # elsewhere it is torch's own
        assert torch.get_default_dtype() is torch.float32
    finally:
        torch.set_default_dtype(torch.float32)
        torch.use_deterministic_algorithms(was_deterministic)


def test_a_job_thread_does_not_put_back_the_float32_matmul_precision(patched):
    # dynamo saves the CUDA matmul precision before a compile and sets it back after (even on a CPU-only torch): a
    # program's set_float32_matmul_precision("high") made meanwhile read back "none"
    before = torch.get_float32_matmul_precision()
    saved = torch._C._get_fp32_precision_getter("cuda", "matmul")
    torch.set_float32_matmul_precision("high")  # the program's change, made while the job compiled
    try:
        def dynamo_restore() -> None:
            with job_rng.on_job_thread():
                torch._C._set_fp32_precision_setter("cuda", "matmul", saved)

        thread = threading.Thread(target=dynamo_restore)
        thread.start()
        thread.join()
        assert torch._C._get_fp32_precision_getter("cuda", "matmul") == "tf32"
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)
