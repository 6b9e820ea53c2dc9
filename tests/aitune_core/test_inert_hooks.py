"""inert_hooks: transformers' output-capturing hooks do not count as hooks on submodules; every other hook does."""

from __future__ import annotations

import pytest
import torch

from aitune_core.backends.inert_hooks import counted, is_inert
from aitune_core.backends.module_watch import submodule_hooks


def _named(module: str, qualname: str):
    def hook(*args):
        return None

    hook.__module__, hook.__qualname__ = module, qualname
    return hook


def test_only_the_listed_library_hooks_are_inert():
    capture = _named("transformers.utils.output_capturing",
                     "install_output_capuring_hook.<locals>.output_capturing_hook")
    assert is_inert(capture)
    assert not is_inert(_named("transformers.utils.output_capturing", "some_other_hook"))
    assert not is_inert(_named("my_app.hooks", "output_capturing_hook"))  # same name, another module
    assert not is_inert(lambda *a: None) and not is_inert(object())
    assert counted({1: capture, 2: lambda *a: None}) == 1


def _tiny_bert():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32)
    return transformers.BertModel(config).eval()


def test_a_bert_that_collected_hidden_states_once_has_no_counted_hooks_but_a_users_hook_counts():
    bert = _tiny_bert()
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        out = bert(input_ids=ids, output_hidden_states=True)
    assert len(out.hidden_states) == 3
    installed = sum(len(m._forward_hooks) for m in bert.modules())
    assert installed > 0  # transformers left its hooks on the layers
    assert submodule_hooks(bert) == 0
    handle = bert.encoder.layer[0].register_forward_hook(lambda *a: None)
    assert submodule_hooks(bert) == 1
    handle.remove()
