"""Real third-party workloads as unmodified scripts (no aitune code here), tiny for CI or at real size on a GPU.

    python -m benchmarks.real_workloads.workload WORKLOAD --out FILE [--size tiny|real] [--device cpu|cuda]
        [--until-tuned SECONDS] [--autocast bf16|fp16]        # (from the repository root)

Builds the model from a config with random weights (no download), runs it the way users do (greedy
`generate()` with the default DynamicCache, a DDIM denoising loop with classifier-free guidance, a module that
appends to a caller-owned cache, a sentence-transformers-style module that adds keys to its input dict, a
sentence-embedding service over a BERT encoder with requests of varying batch size and length (by hand, and
through sentence-transformers' `encode()` when it is installed), a scoring service over a Qwen2 causal LM called
with `use_cache` left on (each call returns a new DynamicCache), image classifiers
(transformers' ViT, timm's ConvNeXt when timm is installed) at batches 1 and 8) and
saves with `torch.save` everything a user could observe: tokens, scores, per-call outputs and their types, the
state of objects the program owns, plus the wall time of every call. `correctness.py` (GPU) and
tests/aitune_jit/test_real_workloads.py (CPU) run it plainly and under
`AUTOWRAPT_BOOTSTRAP=aitune_enable_jit_tuning` and compare the two files.

`--until-tuned S` (generation, the UNet, the request-serving workloads) is for speed measurements of background
tuning: while aitune's background worker still has work (read from `aitune_jit.worker` when the env var loaded it;
the script itself imports nothing of aitune), the script keeps producing results, for at most S seconds, until one
whole cycle of the configured results ran with the worker idle, then produces the configured number once more, so
the last result is the steady state; `tuned_after_s` says when the worker went idle for good.

`--autocast DTYPE` runs the whole workload inside `torch.autocast(device, dtype)`, as a user serving in reduced
precision writes it.

Sizes: `tiny` is CI-sized (a few seconds on a 2-core CPU); `real` is GPT2Config() (124M) with prompts of 16/24/32
tokens, an SD-1.5-shaped UNet2DConditionModel(sample_size=64, cross_attention_dim=768), BertConfig() (BERT-base)
for the embeddings (requests of 1-16 sentences of up to 128 tokens by hand, 1-24 sentences of 3-60 words through
sentence-transformers), ViT-B/16 and convnext_tiny at 224 pixels.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.real_workloads import clock, generation_patterns
from benchmarks.real_workloads.clock import SIZES, Size, rounds, timed


def _generate(model: Any, vocab: int, size: Size, device: str) -> dict[str, Any]:
    tokens, scores, times, new_tokens = [], [], [], []
    clock: dict[str, float] = {}
    with torch.no_grad():
        for call in rounds(size.generate_calls, clock):
            # the prompt depends only on the call's place in the configured cycle: every contender's last calls
            # (after `--until-tuned` rounds or not) generate from the same prompts, so their times compare
            index = call % size.generate_calls
            length = size.prompt_lengths[index % len(size.prompt_lengths)]
            seeded = torch.Generator().manual_seed(1000 + index)
            ids = torch.randint(3, vocab, (1, length), generator=seeded).to(device)

            def run(ids: torch.Tensor = ids) -> Any:
                return model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=size.new_tokens,
                    do_sample=False,
                    output_scores=True,
                    return_dict_in_generate=True,
                    pad_token_id=0,
                )

            out = timed(device, run, times)
            tokens.append(out.sequences.cpu())
            new_tokens.append(int(out.sequences.shape[1]) - length)
            scores.append(torch.stack([s.float().cpu() for s in out.scores]))
    return {"tokens": tokens, "scores": scores, "times": times, "new_tokens": new_tokens, **clock}


def gpt2(size: Size, real: bool, device: str) -> dict[str, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config() if real else GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=96, n_positions=64)
    model = _prepared(GPT2LMHeadModel(config).eval().to(device))
    return _generate(model, config.vocab_size, size, device)


def llama(size: Size, real: bool, device: str) -> dict[str, Any]:
    from transformers import LlamaConfig, LlamaForCausalLM

    width = (512, 1376, 8, 8, 4, 32000) if real else (64, 128, 2, 4, 2, 96)
    config = LlamaConfig(
        hidden_size=width[0], intermediate_size=width[1], num_hidden_layers=width[2], num_attention_heads=width[3],
        num_key_value_heads=width[4], vocab_size=width[5], max_position_embeddings=256,
    )
    model = LlamaForCausalLM(config).eval().to(device)
    return _generate(model, config.vocab_size, size, device)


def t5(size: Size, real: bool, device: str) -> dict[str, Any]:
    from transformers import T5Config, T5ForConditionalGeneration

    shape = {} if real else {"vocab_size": 96, "d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2, "num_heads": 4}
    config = T5Config(**shape, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = T5ForConditionalGeneration(config).eval().to(device)
    return _generate(model, config.vocab_size, size, device)


def bart(size: Size, real: bool, device: str) -> dict[str, Any]:
    from transformers import BartConfig, BartForConditionalGeneration

    shape = {} if real else {
        "vocab_size": 96, "d_model": 64, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
        "decoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "max_position_embeddings": 64,
    }
    config = BartConfig(
        **shape, pad_token_id=0, bos_token_id=2, eos_token_id=1, decoder_start_token_id=2, forced_eos_token_id=None
    )
    model = BartForConditionalGeneration(config).eval().to(device)
    return _generate(model, config.vocab_size, size, device)


class KeyValueLog:
    """A caller-owned object a module appends to (a hand-written KV cache)."""

    def __init__(self) -> None:
        self.entries: list[torch.Tensor] = []
        self.calls = 0


class AppendingModel(torch.nn.Module):
    def __init__(self, width: int = 48) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(width, width)
        self.out = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor, log: KeyValueLog) -> torch.Tensor:
        h = self.proj(x)
        log.entries.append(h)
        log.calls += 1
        context = torch.stack(log.entries).mean(0)
        return self.out(h + context)


def appending(size: Size, real: bool, device: str) -> dict[str, Any]:
    model = AppendingModel().eval().to(device)
    log = KeyValueLog()
    generator = torch.Generator().manual_seed(1)
    outputs = []
    with torch.no_grad():
        for _ in range(6):
            outputs.append(model(torch.randn(2, 48, generator=generator).to(device), log).cpu())
    return {"outputs": outputs, "entries": [e.cpu() for e in log.entries], "calls": log.calls}


class Encoder(torch.nn.Module):
    def __init__(self, width: int = 48) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(64, width)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, 96), torch.nn.GELU(), torch.nn.Linear(96, width))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.embed(input_ids))


class Pooling(torch.nn.Module):
    """sentence-transformers style: reads its features dict and adds keys to it."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()

    def forward(self, features: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        tokens = self.encoder(features["input_ids"])
        features["token_embeddings"] = tokens
        features["sentence_embedding"] = tokens.mean(1)
        return features


def dict_mutation(size: Size, real: bool, device: str) -> dict[str, Any]:
    model = Pooling().eval().to(device)
    generator = torch.Generator().manual_seed(1)
    results = []
    with torch.no_grad():
        for length in (6, 9, 7, 12, 8, 10):
            features = {"input_ids": torch.randint(0, 64, (2, length), generator=generator).to(device)}
            out = model(features)
            results.append({"same_object": out is features, "keys": sorted(features),
                            "embedding": features["sentence_embedding"].cpu()})
    return {"results": results}


def _unet(real: bool) -> torch.nn.Module:
    from diffusers import UNet2DConditionModel

    if real:  # SD 1.5's UNet shape
        return UNet2DConditionModel(sample_size=64, cross_attention_dim=768)
    return UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8,
    )


#: `--compile MODE`: the script as a torch.compile user writes it (the comparison aitune is measured against)
COMPILE_MODE: str | None = None


def _prepared(model: torch.nn.Module) -> Any:
    """`model.compile(mode=...)` in place (the module's own calls, e.g. inside `generate()`, run compiled)."""
    if COMPILE_MODE is not None:
        model.compile(mode=None if COMPILE_MODE == "default" else COMPILE_MODE)
    return model


def _replay_unet(model: torch.nn.Module, recorded: dict[str, Any], device: str) -> dict[str, Any]:
    """Each recorded call's inputs through `model` again: per-call references for another run's outputs."""
    calls = []
    text = recorded["text"].to(device)
    with torch.no_grad():
        for call in recorded["calls"]:
            out = model(call["input"].to(device), call["t"].to(device), encoder_hidden_states=text)
            calls.append({"type": type(out).__qualname__, "sample_type": type(out.sample).__qualname__,
                          "sample": out.sample.cpu()})
    return {"calls": calls}


def unet(size: Size, real: bool, device: str, replay: dict[str, Any] | None = None) -> dict[str, Any]:
    """A DDIM loop with classifier-free guidance (batch 2: unconditional and conditional). Every call's inputs are
    kept, so another process can replay them (`replay`): a per-call comparison on identical inputs, which a
    comparison of whole trajectories is not (a random-weight UNet with guidance 7.5 amplifies any difference)."""
    from diffusers import DDIMScheduler

    model = _prepared(_unet(real).eval().to(device))
    if replay is not None:
        return _replay_unet(model, replay, device)
    scheduler = DDIMScheduler(num_train_timesteps=1000 if real else 100)
    scheduler.set_timesteps(size.denoise_steps)
    generator = torch.Generator().manual_seed(1)
    side, channels = (64, 768) if real else (8, 32)
    text = torch.randn(2, 77 if real else 5, channels, generator=generator).to(device)
    calls, images, times = [], [], []
    clock: dict[str, float] = {}
    with torch.no_grad():
        for _image in rounds(size.images, clock):
            latents = torch.randn(1, 4, side, side, generator=generator).to(device)
            for t in scheduler.timesteps:
                batch = torch.cat([latents] * 2)
                out = timed(device, lambda b=batch, t=t: model(b, t, encoder_hidden_states=text), times)
                calls.append({"type": type(out).__qualname__, "sample_type": type(out.sample).__qualname__,
                              "sample": out.sample.cpu(), "input": batch.cpu(), "t": t.cpu()})
                uncond, cond = out.sample.chunk(2)
                latents = scheduler.step(uncond + 7.5 * (cond - uncond), t, latents).prev_sample
            images.append(latents.cpu())
    return {"calls": calls, "images": images, "times": times, "text": text.cpu(), "steps_per_image": size.denoise_steps,
            **clock}


def unet_freeu(size: Size, real: bool, device: str) -> dict[str, Any]:
    """A UNet loop while the program switches FreeU on and off and swaps the attention processors between loops
    (diffusers' `enable_freeu` / `disable_freeu` / `set_attn_processor`): state a compiled graph was traced with."""
    from diffusers.models.attention_processor import AttnProcessor

    model = _prepared(_unet(real).eval().to(device))
    side, channels = (64, 768) if real else (8, 32)
    text = torch.randn(2, 77 if real else 5, channels, generator=torch.Generator().manual_seed(1)).to(device)
    switches = [lambda: None, lambda: model.enable_freeu(s1=0.9, s2=0.2, b1=1.2, b2=1.4), model.disable_freeu,
                lambda: model.set_attn_processor(AttnProcessor())]
    latents_seen = []
    with torch.no_grad():
        for switch in switches:
            switch()
            for _loop in range(2):
                latents = torch.randn(2, 4, side, side, generator=torch.Generator().manual_seed(3)).to(device)
                for step in range(size.denoise_steps):
                    t = torch.tensor(999 - 100 * step, device=device)
                    latents = latents - 0.1 * model(latents, t, encoder_hidden_states=text).sample
                    latents_seen.append(latents.cpu())
    return {"latents": latents_seen}


def _served(model: Any, requests: list[Any], answer: Callable[[Any, Any], torch.Tensor], device: str) -> dict[str, Any]:
    """Requests answered one after another (`--until-tuned`: the cycle again while tuning runs); per request the
    answer on the CPU and the call's time. Tensor requests (dicts of tensors) are moved to `device` first."""
    outputs, times = [], []
    clock: dict[str, float] = {}
    with torch.no_grad():
        for call in rounds(len(requests), clock):
            request = requests[call % len(requests)]
            if isinstance(request, dict):
                request = {k: v.to(device) for k, v in request.items()}
            outputs.append(timed(device, lambda r=request: answer(model, r), times).float().cpu())
    return {"outputs": outputs, "times": times, "requests": len(requests), **clock}


def _sentence_embedding(model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """sentence-transformers' recipe: the mean of the token states under the mask, L2-normalized."""
    states = model(**inputs).last_hidden_state
    mask = inputs["attention_mask"].unsqueeze(-1).to(states.dtype)
    pooled = (states * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
    return torch.nn.functional.normalize(pooled, dim=-1)


def embeddings(size: Size, real: bool, device: str) -> dict[str, Any]:
    """A sentence-embedding service: a BERT encoder answering requests of varying batch size and length, each
    sentence right-padded to its request's longest one."""
    from transformers import BertConfig, BertModel

    config = BertConfig() if real else BertConfig(vocab_size=96, hidden_size=64, num_hidden_layers=2,
                                                  num_attention_heads=4, intermediate_size=128)
    model = _prepared(BertModel(config, add_pooling_layer=False).eval().to(device))
    generator = torch.Generator().manual_seed(3)
    shapes = [(8, 64), (8, 48), (1, 12), (8, 128), (4, 33), (8, 64), (16, 96), (2, 20)] if real else [
        (4, 12), (4, 9), (1, 5), (4, 16), (2, 7), (4, 12), (8, 14), (2, 6)]
    requests = []
    for batch, longest in shapes:
        lengths = torch.randint(max(2, longest // 3), longest + 1, (batch,), generator=generator)
        lengths[0] = longest
        mask = (torch.arange(longest) < lengths.unsqueeze(1)).long()
        ids = torch.randint(3, config.vocab_size, (batch, longest), generator=generator) * mask
        requests.append({"input_ids": ids, "attention_mask": mask})
    return _served(model, requests, _sentence_embedding, device)



def _last_token_scores(model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The next-token scores after each sequence's last token (left-padded), as a scoring or reranking service
    reads them; the model is called as such services call it, with `use_cache` left on (it returns a new
    DynamicCache nobody reads)."""
    return model(**inputs).logits[:, -1]


def decoder_scoring(size: Size, real: bool, device: str) -> dict[str, Any]:
    """A Qwen2 causal LM behind a scoring service: requests of varying batch size and length, left-padded, the
    cycle served twice (the JIT records eight calls of a graph whose lengths vary before it tunes it)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    width = (896, 4864, 8, 14, 2, 32000) if real else (64, 128, 2, 4, 2, 96)
    config = Qwen2Config(hidden_size=width[0], intermediate_size=width[1], num_hidden_layers=width[2],
                         num_attention_heads=width[3], num_key_value_heads=width[4], vocab_size=width[5],
                         max_position_embeddings=512)
    model = _prepared(Qwen2ForCausalLM(config).eval().to(device))
    generator = torch.Generator().manual_seed(6)
    shapes = [(8, 64), (8, 48), (1, 12), (8, 128), (4, 33), (8, 64)] if real else [
        (4, 12), (4, 9), (1, 5), (4, 16), (2, 7), (4, 12)]
    requests = []
    for batch, longest in shapes:
        lengths = torch.randint(max(2, longest // 3), longest + 1, (batch,), generator=generator)
        lengths[0] = longest
        mask = (torch.arange(longest).flip(0) < lengths.unsqueeze(1)).long()
        requests.append({"input_ids": torch.randint(3, config.vocab_size, (batch, longest), generator=generator) * mask,
                         "attention_mask": mask})
    return _served(model, requests * 2, _last_token_scores, device)  # (tuned during the first cycle: lengths vary)

def sentence_transformers(size: Size, real: bool, device: str) -> dict[str, Any]:
    """sentence-transformers' own `encode()` (which sorts, batches, tokenizes and pools): a BERT model and a word
    vocabulary written to a temporary folder and loaded as a `SentenceTransformer` of Transformer, mean Pooling
    and Normalize modules; requests of 1-24 sentences of 3-60 words, encoded in batches of 8. Needs
    sentence-transformers."""
    import os
    import random
    import tempfile

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # (everything is local: nothing may be fetched)
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel, BertTokenizer

    words = [f"w{i}" for i in range(600)]
    with tempfile.TemporaryDirectory(prefix="st-") as folder:
        with open(os.path.join(folder, "vocab.txt"), "w") as vocab:
            vocab.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
        BertTokenizer(os.path.join(folder, "vocab.txt")).save_pretrained(folder)
        shape = {} if real else {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                 "intermediate_size": 128}
        config = BertConfig(vocab_size=len(words) + 5, **shape)
        BertModel(config, add_pooling_layer=False).save_pretrained(folder)
        encoder = models.Transformer(folder, max_seq_length=128)
        model = SentenceTransformer(modules=[encoder, models.Pooling(config.hidden_size, pooling_mode="mean"),
                                             models.Normalize()], device=device)
    model.eval()
    rng = random.Random(5)
    requests = [[" ".join(rng.choice(words) for _ in range(rng.randint(3, 60))) for _ in range(count)]
                for count in (8, 8, 3, 24, 1, 8, 16, 5)]
    return _served(model, requests, _encode, device)


def _encode(model: Any, sentences: list[str]) -> torch.Tensor:
    return model.encode(sentences, batch_size=8, convert_to_tensor=True, show_progress_bar=False)


def _classify(model: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    out = model(inputs["pixel_values"])
    return out if isinstance(out, torch.Tensor) else out.logits


def _images(shapes: list[tuple[int, int]]) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(4)
    return [{"pixel_values": torch.randn(batch, 3, side, side, generator=generator)} for batch, side in shapes]


def vit(size: Size, real: bool, device: str) -> dict[str, Any]:
    """An image classifier (transformers' ViT, ViT-B/16 at 224 pixels) answering batches of 1 and 8."""
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(num_labels=10) if real else ViTConfig(
        image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, num_labels=10)
    model = _prepared(ViTForImageClassification(config).eval().to(device))
    side = config.image_size
    return _served(model, _images([(1, side), (1, side), (8, side), (1, side), (8, side), (4, side)]), _classify,
                   device)


def timm_convnext(size: Size, real: bool, device: str) -> dict[str, Any]:
    """timm's ConvNeXt (convnext_tiny at 224 pixels; convnext_atto at 64 for CI sizes) answering batches of 1 and
    8; needs timm."""
    import timm

    model = _prepared(timm.create_model("convnext_tiny" if real else "convnext_atto", num_classes=10).eval().to(device))
    side = 224 if real else 64
    return _served(model, _images([(1, side), (1, side), (8, side), (1, side), (8, side), (4, side)]), _classify,
                   device)


WORKLOADS: dict[str, Callable[[Size, bool, str], dict[str, Any]]] = {
    f.__name__: f for f in (
        gpt2, llama, t5, bart, appending, dict_mutation, unet, unet_freeu, embeddings, decoder_scoring,
        sentence_transformers, vit, timm_convnext)
} | generation_patterns.WORKLOADS


AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--replay", default=None, help="unet: run the calls recorded in this result file again")
    parser.add_argument("--compile", default=None, choices=["default", "reduce-overhead", "max-autotune"],
                        help="gpt2/unet: wrap the model in torch.compile(mode=...) as a compile user would")
    parser.add_argument("--until-tuned", type=float, default=0.0, metavar="SECONDS",
                        help="keep going while aitune's background worker is busy, at most this long")
    parser.add_argument("--autocast", default=None, choices=sorted(AUTOCAST),
                        help="run the workload inside torch.autocast(device, dtype)")
    args = parser.parse_args()
    global COMPILE_MODE
    COMPILE_MODE, clock.UNTIL_TUNED_S = args.compile, args.until_tuned
    torch.manual_seed(0)
    start = time.perf_counter()
    size, real = SIZES[args.size], args.size == "real"
    if args.replay is not None and args.workload != "unet":
        parser.error("--replay is for the unet workload")
    device_type = torch.device(args.device).type
    with torch.autocast(device_type, dtype=AUTOCAST.get(args.autocast), enabled=args.autocast is not None):
        if args.replay is not None:
            result = unet(size, real, args.device, replay=torch.load(args.replay))
        else:
            result = WORKLOADS[args.workload](size, real, args.device)
    result["wall_s"] = time.perf_counter() - start
    torch.save(result, args.out)


if __name__ == "__main__":
    main()
