"""A greedy `generate()` call of a GPT-2 built from a config, as one timed request of `tree_ab.py`.

Why: a decoding step passes a `DynamicCache`, so a tuned decoder's every call takes the dispatch path's slow
branch (binding the call, walking the cache's layout: `object_signature`), 32 times per request here. A model of
real depth (12 layers: the cache has 12 of everything) and small width keeps the host's share of each step
large on the CPU; on a GPU the model is GPT2Config() itself, where a step is short enough for the host to show.
The prompt is fixed (16 tokens), so every request runs the same graphs after the first ones are tuned.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

NAME = "gpt2-generate"
PROMPT = 16
NEW_TOKENS = 32


def build(device: torch.device) -> tuple[torch.nn.Module, Callable[[], Any]]:
    """The model and one request (a `generate()` call of `NEW_TOKENS` tokens after a `PROMPT`-token prompt)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    small = {} if device.type == "cuda" else {"n_embd": 64, "n_head": 2, "vocab_size": 256, "n_positions": 128}
    model = GPT2LMHeadModel(GPT2Config(**small)).eval().to(device)
    ids = torch.randint(3, model.config.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)

    def request() -> Any:
        with torch.no_grad():
            return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                                  min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)

    return model, request
