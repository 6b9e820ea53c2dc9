"""Exception hierarchy shared by every layer.

One base class lets callers (and the JIT hook, which must never break a user's program)
catch everything aitune raises on purpose without swallowing unrelated bugs.
"""

from __future__ import annotations


class AITuneError(Exception):
    """Base of every error aitune raises deliberately."""


class BackendStateError(AITuneError, RuntimeError):
    """An illegal backend state transition (the message names the state)."""


class BackendBuildError(AITuneError, RuntimeError):
    """A backend could not be built for a module/graph; strategies move on to the next candidate."""


class BackendNotAvailableError(BackendBuildError, ImportError):
    """The optional library a backend needs is not installed."""

    def __init__(self, package: str, extra: str) -> None:
        super().__init__(f"{package} is not installed; pip install 'aitune[{extra}]'")
        self.package = package
        self.extra = extra


class ValidationError(AITuneError, RuntimeError):
    """A built backend produced outputs that are not finite, have wrong shapes or wrong values."""


class TuningFailedError(AITuneError, RuntimeError):
    """No candidate backend could be built and validated."""


class NotFasterThanEagerError(TuningFailedError):
    """No candidate beats the original module by the strategy's margin, or the module is too cheap to be worth
    a dispatch: the caller keeps the original module (a normal outcome, not a fault)."""


class CheckpointError(AITuneError, ValueError):
    """A checkpoint is corrupt, does not match the model, or fails its checksums."""


class ConfigError(AITuneError, ValueError):
    """A configuration value is invalid."""


class NotReplayableError(AITuneError, RuntimeError):
    """A recorded call cannot be replayed without the caller's live objects (an argument that cannot be copied)."""
