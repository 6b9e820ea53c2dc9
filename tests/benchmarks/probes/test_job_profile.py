"""benchmarks/probes/job_profile.py: categories of a job's stacks, shares, sampling a live thread by name."""

from __future__ import annotations

import threading
import time

from benchmarks.probes import job_profile

WAIT = "/x/aitune_jit/worker_yield.py:_wait"
IMPORT = "<frozen importlib._bootstrap>:_find_and_load"
DYNAMO = "/site/torch/_dynamo/symbolic_convert.py:step"
INDUCTOR = "/site/torch/_inductor/graph.py:run"
JOB = "/x/aitune_jit/worker.py:_job_body"


def test_the_innermost_marker_decides_and_the_wait_wins_over_what_it_interrupts():
    # a step-aside wait inside dynamo's trace is stepping aside, not tracing
    assert job_profile.category([WAIT, DYNAMO, JOB]) == "stepping aside"
    # an import Inductor makes while lowering is an import
    assert job_profile.category([IMPORT, INDUCTOR, DYNAMO, JOB]) == "import"
    assert job_profile.category([INDUCTOR, DYNAMO, JOB]) == "inductor lowering"
    assert job_profile.category([DYNAMO, JOB]) == "dynamo trace"
    assert job_profile.category(["/usr/lib/python3.12/threading.py:run"]) == "other"


def test_shares_count_each_function_once_per_sample():
    profile = job_profile.JobProfile(period_s=0.01)
    profile.add([DYNAMO, DYNAMO, JOB], "Building TorchInductorBackend")
    profile.add([WAIT, JOB])
    summary = profile.summary()
    assert summary["samples"] == 2 and summary["seconds"] == 0.02
    assert summary["by_category"] == {"dynamo trace": 0.5, "stepping aside": 0.5}
    assert summary["by_phase"] == {"Building": 0.5, "other": 0.5}
    assert summary["top_inclusive"]["aitune_jit/worker.py:_job_body"] == 1.0  # (in both stacks, counted once each)
    assert summary["top_inclusive"]["_dynamo/symbolic_convert.py:step"] == 0.5
    assert summary["top_leaf"] == {"_dynamo/symbolic_convert.py:step": 0.5, "aitune_jit/worker_yield.py:_wait": 0.5}


def test_only_threads_named_as_jobs_are_sampled():
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            time.sleep(0.001)

    profile = job_profile.JobProfile(threads="test-tuning-job")  # (other tests' job threads may still live)
    other = threading.Thread(target=busy, name="program-thread", daemon=True)
    other.start()
    profile.sample()
    assert profile.samples == 0
    job = threading.Thread(target=busy, name="test-tuning-job-1", daemon=True)
    job.start()
    try:
        profile.sample()
    finally:
        stop.set()
    assert profile.samples == 1
    assert any(name.endswith("test_job_profile.py:busy") for name in profile.summary()["top_inclusive"])
