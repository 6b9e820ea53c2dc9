"""`RangeGrowth`: a tuned graph whose calls keep falling outside its tuned shape ranges is tuned again.

Why: a graph's ranges (batch size, sequence length, ...) come from the calls recorded before it was tuned - with
the default `min_samples` of 2, two calls. A server whose requests vary in length then ran most calls eagerly
for good (a BERT classifier with sequence lengths 32..128: 160 of 200 calls on the CPU). Calls outside the range
still go to the original module (the dispatcher warns once), and are recorded: the recorder widens the graph's
ranges and keeps the extremes among its samples. After `jit_config.retune_after_misses` such calls, the node
tunes that graph again over everything seen so far, and the new backend replaces the old one. A graph is tuned
again at most `MAX_RETUNES` times, so a stream of ever-new shapes cannot keep the process compiling.
"""

from __future__ import annotations

from aitune_jit.config import jit_config

#: re-tunes of one graph at most (each is a compile)
MAX_RETUNES = 3
#: calls that missed a graph's compiled code, recorded for its next tuning (`keep_missed`)
MISSED_SAMPLES = 2


class RangeGrowth:
    """Per node: calls of each tuned graph that ran eagerly because their shapes were outside its ranges."""

    __slots__ = ("code_total", "due", "kept", "misses", "retunes", "total")

    def __init__(self) -> None:
        self.misses: dict[str, int] = {}  # since the graph was last tuned
        self.retunes: dict[str, int] = {}
        self.due: set[str] = set()  # graphs to tune again on the next tuning pass
        self.total = 0  # every call that ran eagerly outside a tuned range
        self.code_total = 0  # every call that missed its graph's compiled code (`code=True`): no shape of its own
        self.kept: dict[str, int] = {}  # calls that missed the compiled code, recorded since the graph was tuned

    def missed(self, name: str, *, code: bool = False) -> bool:
        """Count one call of tuned graph `name` outside its ranges (or, `code`, one that missed the compiled code:
        dynamo's guards failed); True when the graph is now due for re-tuning."""
        if code:
            self.code_total += 1
        else:
            self.total += 1
        threshold = jit_config.retune_after_misses
        if threshold <= 0 or name in self.due or self.retunes.get(name, 0) >= MAX_RETUNES:
            return False
        count = self.misses[name] = self.misses.get(name, 0) + 1
        if count < threshold:
            return False
        self.due.add(name)
        return True

    def keep_missed(self, name: str) -> bool:
        """Whether a call of `name` that missed its compiled code is recorded (and counted as such): at most
        `MISSED_SAMPLES` between two tunings. Why: such a call's input layout (the strides of a cache the
        program's last call left, say) is one the compile never saw; re-tuned on the old samples alone, the graph
        would miss again."""
        count = self.kept.get(name, 0)
        if count >= MISSED_SAMPLES:
            return False
        self.kept[name] = count + 1
        return True

    def retuned(self, name: str) -> None:
        """The re-tuning of `name` ran (whatever its outcome): count it and start counting misses anew."""
        self.due.discard(name)
        self.kept.pop(name, None)
        self.misses[name] = 0
        self.retunes[name] = self.retunes.get(name, 0) + 1
