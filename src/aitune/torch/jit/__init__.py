"""JIT tuning controls: `import aitune.torch.jit.enable` switches it on; `disable()` switches it off;
`wait_until_tuned(timeout)` waits for the background tuning worker to finish what is queued."""

from aitune_jit.switch import disable, enable, is_enabled
from aitune_jit.worker import wait_until_tuned

__all__ = ["disable", "enable", "is_enabled", "wait_until_tuned"]
