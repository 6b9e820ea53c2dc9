import torch

from aitune_core.backends.recompile_limit import RECOMPILE_LIMIT, raised_recompile_limit


def test_the_limit_is_raised_while_the_block_runs_only():
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    before = getattr(config, name)
    with raised_recompile_limit():
        assert getattr(config, name) == max(before, RECOMPILE_LIMIT)
    assert getattr(config, name) == before
