"""`generate()` as chat servers and decoding libraries call it, beyond one greedy call per prompt.

Each pattern hands the model state it keeps or reshapes between its calls, which a tuned module must treat
exactly as eager does:

- `llama_chat`: a three-turn conversation that passes the previous turn's `past_key_values` (a DynamicCache
  holding the whole conversation) into the next turn's `generate()`;
- `llama_assisted`: assisted (speculative) decoding with a one-layer draft model: the target model verifies
  several drafted tokens per call and the caches of both models are cropped back after every rejection;
- `t5_beams`: beam search (4 beams, 2 returned sequences) on an encoder-decoder: the cache is reordered by
  beam at every step;
- `gpt2_sampling`: top-k / top-p sampling seeded with `torch.manual_seed` before each call: the tokens are
  identical only if nothing else draws from, or rewinds, the program's random streams.

Every call's tokens and scores are kept for `correctness.py`'s comparison (same layout as `workload.py`'s
greedy `generate()` workloads: the call `j` of a run that went on while tuning used the inputs of call `j % n`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from benchmarks.real_workloads.clock import Size, rounds, timed


def _prompt(index: int, length: int, vocab: int, device: str) -> torch.Tensor:
    seeded = torch.Generator().manual_seed(1000 + index)
    return torch.randint(3, vocab, (1, length), generator=seeded).to(device)


def _llama(real: bool, layers: int | None = None, seed: int = 0) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    width = (512, 1376, 8, 8, 4, 32000) if real else (64, 128, 2, 4, 2, 96)
    config = LlamaConfig(
        hidden_size=width[0], intermediate_size=width[1], num_hidden_layers=layers or width[2],
        num_attention_heads=width[3], num_key_value_heads=width[4], vocab_size=width[5], max_position_embeddings=512,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def _generations(size: Size, device: str, calls_per_round: int,
                 one_round: Callable[[int], list[Any]]) -> dict[str, Any]:
    """Runs `one_round(index)` for each round (index: the place in the configured cycle), each returning the
    `generate()` outputs of its calls; keeps their tokens and scores."""
    tokens, scores, times, new_tokens = [], [], [], []
    clock: dict[str, float] = {}
    with torch.no_grad():
        for call in rounds(size.generate_calls, clock):
            outputs = timed(device, lambda index=call % size.generate_calls: one_round(index), times)
            assert len(outputs) == calls_per_round
            for out, prompt_length in outputs:
                tokens.append(out.sequences.cpu())
                new_tokens.append(int(out.sequences.shape[1]) - prompt_length)
                scores.append(torch.stack([s.float().cpu() for s in out.scores]))
    return {"tokens": tokens, "scores": scores, "times": times, "new_tokens": new_tokens, **clock}


def llama_chat(size: Size, real: bool, device: str) -> dict[str, Any]:
    model = _llama(real).to(device)
    vocab = model.config.vocab_size

    def conversation(index: int) -> list[Any]:
        turns, context, cache = [], None, None
        for turn in range(3):
            said = _prompt(10 * index + turn, size.prompt_lengths[(index + turn) % len(size.prompt_lengths)], vocab,
                           device)
            context = said if context is None else torch.cat([context, said], dim=1)
            out = model.generate(context, attention_mask=torch.ones_like(context), past_key_values=cache,
                                 max_new_tokens=size.new_tokens, do_sample=False, output_scores=True,
                                 return_dict_in_generate=True, pad_token_id=0)
            turns.append((out, context.shape[1]))
            context, cache = out.sequences, out.past_key_values
        return turns

    return _generations(size, device, 3, conversation)


def llama_assisted(size: Size, real: bool, device: str) -> dict[str, Any]:
    model = _llama(real).to(device)
    draft = _llama(real, layers=1, seed=1).to(device)
    vocab = model.config.vocab_size

    def assisted(index: int) -> list[Any]:
        ids = _prompt(index, size.prompt_lengths[index % len(size.prompt_lengths)], vocab, device)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=draft,
                             max_new_tokens=size.new_tokens, do_sample=False, output_scores=True,
                             return_dict_in_generate=True, pad_token_id=0)
        return [(out, ids.shape[1])]

    return _generations(size, device, 1, assisted)


def t5_beams(size: Size, real: bool, device: str) -> dict[str, Any]:
    from transformers import T5Config, T5ForConditionalGeneration

    shape = {} if real else {"vocab_size": 96, "d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2, "num_heads": 4}
    config = T5Config(**shape, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    model = T5ForConditionalGeneration(config).eval().to(device)

    def beams(index: int) -> list[Any]:
        ids = _prompt(index, size.prompt_lengths[index % len(size.prompt_lengths)], config.vocab_size, device)
        ids = torch.cat([ids, ids.flip(1)])  # a batch of two prompts
        out = model.generate(ids, attention_mask=torch.ones_like(ids), num_beams=4, num_return_sequences=2,
                             max_new_tokens=size.new_tokens, output_scores=True, return_dict_in_generate=True)
        return [(out, 0)]

    return _generations(size, device, 1, beams)


def gpt2_sampling(size: Size, real: bool, device: str) -> dict[str, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config() if real else GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=96, n_positions=64)
    model = GPT2LMHeadModel(config).eval().to(device)

    def sampled(index: int) -> list[Any]:
        ids = _prompt(index, size.prompt_lengths[index % len(size.prompt_lengths)], config.vocab_size, device)
        torch.manual_seed(2000 + index)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, top_k=20, top_p=0.9,
                             temperature=0.8, max_new_tokens=size.new_tokens, output_scores=True,
                             return_dict_in_generate=True, pad_token_id=0)
        return [(out, ids.shape[1])]

    return _generations(size, device, 1, sampled)


WORKLOADS: dict[str, Callable[[Size, bool, str], dict[str, Any]]] = {
    f.__name__: f for f in (llama_chat, llama_assisted, t5_beams, gpt2_sampling)
}
