"""`refit_backend`: bring a baked-weight backend up to date with its module, synchronously.

The one place the dispatcher asks for a refit (`ModuleWatch.review`), so that refits can later be queued on the
tuning worker instead of running inside the call that noticed the change: the contract is only "True when the
backend now computes with the module's current weights"; until it returns True the original module answers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from aitune_core.log import get_logger, timed

if TYPE_CHECKING:
    from aitune_core.backends.backend import Backend

_logger = get_logger("dispatch")


def refit_backend(backend: Backend) -> bool:
    """Refit `backend` (`Backend.refit`) now; False, with the cause logged, when it cannot be refit."""
    try:
        with torch.no_grad(), timed(_logger, f"Refitting {backend.describe()}"):
            backend.refit()
    except Exception as exc:  # the call is answered by the original module: never the user's failure
        _logger.info("%s cannot be refit (%s: %s); the original module answers its calls",
                     backend.describe(), type(exc).__name__, exc)
        _logger.debug("Refit of %s failed", backend.describe(), exc_info=True)
        return False
    return True
