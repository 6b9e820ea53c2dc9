"""Real third-party workloads under the env var compute what they compute without aitune.

Each case runs `python -m benchmarks.real_workloads.workload WORKLOAD` (CI size) twice in fresh processes:
plainly, and under `AUTOWRAPT_BOOTSTRAP=aitune_enable_jit_tuning` with the default configuration. Everything the
script could observe is compared: generated tokens exactly, scores and per-call outputs within the stated
tolerance, output types, the state of objects the program owns. Tuning happens in the middle of the first
`generate()` (the default `min_samples` is 2). stderr must hold no ERROR-level line and no traceback.

Tolerances: fp32 outputs of Inductor on the CPU agree with eager to about 1e-5; the comparison allows
rtol=1e-3, atol=1e-4 (aitune's own fp32 tolerance). With `AITUNE_JIT_PRECISION=bf16` the UNet's outputs are
computed under bf16 autocast: rtol=atol=5e-2 (aitune's bf16 tolerance), also for the final latents after the
DDIM loop.

CI time: LLaMA (beside GPT-2), T5 (beside BART), the fp32 UNet loop in blocking mode (beside the bf16 one and
the background one) and the UNet loop with FreeU switched (beside test_jit_follow_model.py's run-only tests) are
`heavy`: `make test-all` runs them (tests/conftest.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = ["-m", "benchmarks.real_workloads.workload"]  # (run from the repository root)
#: what a run measures about itself, not what the program computed
_TIMINGS = ("times", "wall_s")
FP32 = {"rtol": 1e-3, "atol": 1e-4}
BF16 = {"rtol": 5e-2, "atol": 5e-2}
#: a level word after a space (aitune counts a job's torch records "at error level", which this does not match)
_ERROR_LINE = re.compile(r"(^|\s)(ERROR|CRITICAL)\b|Traceback \(most recent call last\)|^E\d{4} ", re.MULTILINE)


def _env(tmp_path: Path, jit: bool, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "AUTOWRAPT_BOOTSTRAP" and not k.startswith("AITUNE_JIT_")}
    env["AITUNE_JIT_CACHE_DIR"] = str(tmp_path / "jit-cache")
    env.setdefault("OMP_NUM_THREADS", "1")
    if jit:
        env["AUTOWRAPT_BOOTSTRAP"] = "aitune_enable_jit_tuning"
        # these scripts end soon after tuning starts: tune in the calling thread so the tuned backends answer
        # (test_background_serving.py covers the background worker)
        env["AITUNE_JIT_BLOCKING"] = "1"
        env["AITUNE_JIT_PRINT_HISTORY"] = "1"
    env.update(extra)
    return env


def _run(workload: str, tmp_path: Path, jit: bool, **extra: str) -> tuple[Any, str]:
    out = tmp_path / f"{workload}-{'jit' if jit else 'plain'}.pt"
    result = subprocess.run(
        [sys.executable, *SCRIPT, workload, "--out", str(out)],
        cwd=REPO,
        env=_env(tmp_path, jit, **extra),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-6000:]
    observed = torch.load(out)
    for key in _TIMINGS:
        observed.pop(key, None)
    return observed, result.stderr


def _compare(plain: Any, tuned: Any, tolerance: dict[str, float], path: str = "result") -> None:
    """Same structure, equal non-floating values, floating tensors within `tolerance`."""
    assert type(tuned) is type(plain), f"{path}: {type(tuned).__name__} vs {type(plain).__name__}"
    if isinstance(plain, torch.Tensor):
        if plain.is_floating_point():
            torch.testing.assert_close(tuned, plain, **tolerance, msg=lambda m: f"{path}: {m}")
        else:
            assert torch.equal(tuned, plain), f"{path}: {tuned.tolist()} != {plain.tolist()}"
    elif isinstance(plain, dict):
        assert sorted(tuned) == sorted(plain), path
        for key in plain:
            _compare(plain[key], tuned[key], tolerance, f"{path}[{key!r}]")
    elif isinstance(plain, (list, tuple)):
        assert len(tuned) == len(plain), path
        for index, (a, b) in enumerate(zip(plain, tuned)):
            _compare(a, b, tolerance, f"{path}[{index}]")
    else:
        assert tuned == plain, f"{path}: {tuned!r} != {plain!r}"


def _assert_clean(stderr: str) -> None:
    bad = [line for line in stderr.splitlines() if _ERROR_LINE.search(line)]
    assert not bad, "ERROR-level output on stderr:\n" + "\n".join(bad[:20])


def _history(stderr: str) -> str:
    return stderr[stderr.find("JIT Tuning History") :] if "JIT Tuning History" in stderr else stderr


def _check(workload: str, tmp_path: Path, tolerance: dict[str, float] = FP32, **extra: str) -> str:
    plain, _ = _run(workload, tmp_path, jit=False)
    tuned, stderr = _run(workload, tmp_path, jit=True, **extra)
    _compare(plain, tuned, tolerance)
    _assert_clean(stderr)
    assert "aitune JIT tuning summary" in stderr
    return stderr


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["gpt2", pytest.param("llama", marks=pytest.mark.heavy)])
def test_decoder_generate_identical(workload, tmp_path):
    """Greedy generate with the default DynamicCache, three prompts; tuning happens during the first one."""
    stderr = _check(workload, tmp_path)
    history = _history(stderr)
    # the model updates the cache: recognised as stateful, recorded on copies, and its root tuned with the cache
    # (transformers 5.23 names the argument `past_key_values`, 5.24 `cache`)
    assert re.search(r"changes its argument `\w+` \(DynamicCache\); its calls are recorded on copies", history), (
        history[-3000:])
    root = "GPT2LMHeadModel" if workload == "gpt2" else "LlamaForCausalLM"
    tuned = rf"Tuning {root} \S+ took [\d.]+s: TorchInductorBackend\(fullgraph=True\) for graph"
    assert re.search(tuned, history), history[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("workload", [pytest.param("t5", marks=pytest.mark.heavy), "bart"])
def test_encoder_decoder_generate_identical(workload, tmp_path):
    _check(workload, tmp_path)


@pytest.mark.slow
def test_caller_owned_object_keeps_its_state(tmp_path):
    """A module appending to an object it is given: same outputs, same object state (6 entries, 6 calls)."""
    stderr = _check("appending", tmp_path)
    assert "changes its argument `log` (KeyValueLog)" in _history(stderr)


@pytest.mark.slow
def test_input_dict_mutation_identical(tmp_path):
    """A forward that adds keys to its input dict is recognised as stateful and recorded on copies; outputs and the
    dict's keys stay what eager gives (that the tuned call adds the keys is test_jit_replay_safety's)."""
    stderr = _check("dict_mutation", tmp_path)
    history = _history(stderr)
    assert "changes its argument `features` (dict); its calls are recorded on copies" in history, history[-3000:]


def _assert_unet_root_validated(stderr: str) -> None:
    """The UNet root was built and validated - its BaseOutput came back as itself - and then tuned, or kept eager
    only because it was not faster: never rejected for its output."""
    history = _history(stderr)
    tuning = [line for line in history.splitlines() if line.startswith("Tuning UNet2DConditionModel")]
    assert tuning, history[-3000:]
    assert "ValidationError" not in tuning[0], tuning[0]
    assert re.search(r"TorchInductorBackend\(.*\) for graph 0|NotFasterThanEagerError", tuning[0]), tuning[0]


@pytest.mark.slow
@pytest.mark.heavy  # (the bf16 case below validates the root the same way; the fp32 loop runs in the background case)
def test_unet_ddim_loop_fp32(tmp_path):
    """diffusers UNet2DConditionModel (BaseOutput result) in a DDIM loop with CFG: types kept, outputs close."""
    _assert_unet_root_validated(_check("unet", tmp_path))


@pytest.mark.slow
def test_unet_ddim_loop_bf16(tmp_path):
    _assert_unet_root_validated(_check("unet", tmp_path, BF16, AITUNE_JIT_PRECISION="bf16"))


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["gpt2", "unet", "appending"])
def test_the_default_background_worker_keeps_every_answer_right(workload, tmp_path):
    """The default mode: tuning runs on the worker thread from the recorded copies while the script goes on.
    Whether the switch to a tuned backend comes before the script ends or not, every output is what plain eager
    computed, the caller's objects are untouched, and exit neither hangs nor prints errors."""
    _check(workload, tmp_path, AITUNE_JIT_BLOCKING="0")


@pytest.mark.slow
def test_sentence_transformers_encode_over_varying_requests(tmp_path):
    """sentence-transformers' own `encode()` (BERT, mean pooling, normalize) over requests of 1-24 sentences of
    varying length: every answer agrees with plain eager, and the model is tuned although each of its modules
    fills the `BatchEncoding` it is given (under `inference_mode`, which the build's warm-up does not cover)."""
    pytest.importorskip("sentence_transformers")
    history = _history(_check("sentence_transformers", tmp_path))
    assert re.search(r"Tuning SentenceTransformer \S+ took [\d.]+s: TorchInductorBackend", history), history[-3000:]


@pytest.mark.slow
@pytest.mark.heavy  # (tests/aitune_jit/test_jit_follow_model.py covers the run-only path with a small module)
def test_a_unet_loop_with_freeu_switched_on_and_off_computes_the_plain_latents(tmp_path):
    """diffusers' `enable_freeu` / `disable_freeu` / `set_attn_processor` between loops change what the compiled
    graph was traced with: the plain forward answers (no compile inside a call) and the UNet is tuned again."""
    history = _check("unet_freeu", tmp_path)
    assert "missed its compiled code" in history and "recorded to tune it again" in history, history[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("workload", [
    "gpt2_sampling",
    pytest.param("llama_chat", marks=pytest.mark.heavy),
    pytest.param("llama_assisted", marks=pytest.mark.heavy),
    pytest.param("t5_beams", marks=pytest.mark.heavy),
])
def test_generation_patterns_that_keep_state_between_calls_generate_the_plain_tokens(workload, tmp_path):
    """benchmarks/real_workloads/generation_patterns.py: seeded sampling (the program's random streams untouched),
    a chat passing its cache from turn to turn, assisted decoding cropping both models' caches, beam search
    reordering the cache: the same tokens and scores as plain eager, and the root is tuned."""
    history = _history(_check(workload, tmp_path))
    assert re.search(r"Tuning \w+ \S+ took [\d.]+s: TorchInductorBackend", history), history[-3000:]


@pytest.mark.slow
def test_a_causal_lm_called_with_use_cache_on_is_tuned_at_the_root_and_answers_the_same(tmp_path):
    """A scoring service calls a Qwen2 causal LM with `use_cache` left on: each call returns a new DynamicCache,
    which validation compares by its state; the root is tuned and every request's scores agree with plain eager."""
    history = _history(_check("decoder_scoring", tmp_path))
    assert re.search(r"Tuning Qwen2ForCausalLM \S+ took [\d.]+s: TorchInductorBackend", history), history[-3000:]
