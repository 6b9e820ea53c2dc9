"""unavailable(device): one answer for configuration and checkpoint loading."""

from __future__ import annotations

import torch

from aitune_core.device_check import unavailable


def test_cpu_and_meta_are_always_there():
    assert unavailable(torch.device("cpu")) is None and unavailable(torch.device("meta")) is None


def test_a_missing_accelerator_or_index_is_explained():
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        assert unavailable(torch.device("cuda", count)) == (
            f"this machine has {count} cuda device(s) (indices 0..{count - 1})"
        )
    else:
        assert unavailable(torch.device("cuda")) == "no cuda device is available on this machine"
