"""JIT tuning controls: `import aitune.torch.jit.enable` switches it on; `disable()` switches it off."""

from aitune_jit.switch import disable, enable, is_enabled

__all__ = ["disable", "enable", "is_enabled"]
