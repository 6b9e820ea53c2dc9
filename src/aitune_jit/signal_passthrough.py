"""An exception that the program's signal handler raises during a blocking tune reaches the program.

Why: with `jit_config.blocking` the call that made a graph ready tunes it in the program's own thread, for
seconds. A program that bounds its calls with a signal (`signal.alarm` / `setitimer` and a handler that raises
its own timeout exception) gets that exception raised wherever the main thread is: inside a compile. There the
backends' and strategies' `except Exception` took it for a failed build, tuning went on with the next candidate,
and the program never saw its timeout (a reviewer's script ran on for 60 s instead of stopping at 6 s).
`KeyboardInterrupt` from the default SIGINT handler is a `BaseException` and passed through already.

How: `passing_through()` wraps, for the duration of an inline tune on the main thread, every signal handler that
is a Python callable (not torch's or Python's defaults); an exception the program's handler raises is carried
out of the tune inside `HandlerRaised`, a `BaseException` that no `except Exception` takes, and the caller raises
the program's exception itself (`HandlerRaised.exc`). A handler that returns normally is untouched. The program's
handlers are put back afterwards, unless the program replaced one meanwhile.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

#: handlers that are Python's own and raise only BaseExceptions (which no `except Exception` takes)
_PASSING_ALREADY = (signal.default_int_handler,)


class HandlerRaised(BaseException):
    """Carries the exception a program's signal handler raised out of a tune (`exc`: raise it for the program)."""

    def __init__(self, exc: BaseException, signum: int) -> None:
        super().__init__(exc)
        self.exc = exc
        self.signum = signum


def _carrying(handler: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(handler)
    def carrying(signum: int, frame: Any) -> Any:
        try:
            return handler(signum, frame)
        except Exception as exc:  # (a BaseException passes through `except Exception` already)
            raise HandlerRaised(exc, signum) from None

    carrying.__aitune_wrapped_handler__ = handler  # type: ignore[attr-defined]
    return carrying


def _python_handlers() -> list[tuple[int, Callable[..., Any]]]:
    found = []
    for signum in signal.valid_signals():
        try:
            handler = signal.getsignal(signum)
        except (OSError, ValueError):
            continue
        if callable(handler) and handler not in _PASSING_ALREADY:
            found.append((signum, handler))
    return found


@contextlib.contextmanager
def passing_through() -> Iterator[None]:
    """Inside the block, on the main thread, the program's signal handlers raise `HandlerRaised` instead of their
    own exceptions; elsewhere it does nothing (only the main thread runs Python signal handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wrapped: list[tuple[int, Callable[..., Any], Callable[..., Any]]] = []
    for signum, handler in _python_handlers():
        carrying = _carrying(handler)
        try:
            signal.signal(signum, carrying)
        except (OSError, ValueError, RuntimeError):
            continue
        wrapped.append((signum, handler, carrying))
    try:
        yield
    finally:
        for signum, handler, carrying in wrapped:
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                if signal.getsignal(signum) is carrying:  # (a handler the program set meanwhile stays)
                    signal.signal(signum, handler)
