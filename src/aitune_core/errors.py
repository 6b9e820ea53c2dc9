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


#: how much of an exception's text a one-line report keeps
BRIEF_LINES = 3
BRIEF_LINE_CHARS = 600  # (aitune's own one-line messages, a validation error's say, stay whole)


def brief(exc: BaseException) -> str:
    """`TypeName: text` of `exc` on one line, for warnings and summaries: its first `BRIEF_LINES` lines of text
    (stack frames and caret lines left out), each cut at `BRIEF_LINE_CHARS`, joined with " / ". Why: torch's
    compiler errors run to pages (dynamo's user errors carry the user's stack twice and links to docs), and one
    failed candidate printed all of it as a WARNING into the program's stderr. The whole text goes to DEBUG."""
    lines = []
    for raw in str(exc).splitlines():
        line = raw.strip()
        if not line or line.startswith(("File \"", "^", "~")) or set(line) <= set("^~ "):
            continue
        lines.append(line if len(line) <= BRIEF_LINE_CHARS else line[:BRIEF_LINE_CHARS] + " ...")
        if len(lines) > BRIEF_LINES:
            break
    text = " / ".join(lines[:BRIEF_LINES]) + (" / ..." if len(lines) > BRIEF_LINES else "")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class CompiledCodeMissed(AITuneError):
    """A backend answered a call with the plain code because its compiled code no longer fits the program's state
    (dynamo's guards failed) and it does not compile on the caller's thread (`Backend.serve`). `output` is that
    call's answer: the dispatcher returns it and tells the backend's owner (`GraphDispatcher`)."""

    def __init__(self, output: object, error: Exception | None = None) -> None:
        super().__init__("the compiled code's guards failed; the plain code answered")
        self.output = output
        #: what the plain code raised (the user's own error: it ran once, and nothing runs it again)
        self.error = error
