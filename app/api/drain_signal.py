"""When Ray Serve starts stopping this replica — before it waits for ongoing requests.

Rule: Ray Serve stops a replica (rolling update, downscale, ``serve delete``) by
waiting until it has no ongoing request, then awaiting the deployment's ``__del__``,
and force-kills the actor ``graceful_shutdown_timeout_s`` after the stop began. A
stream longer than that never reaches ``__del__``: it is killed with its settlement.
So the ingress must learn that the stop began, start its own grace period then, and
end what is still running when the grace is over (billing what it produced), leaving
Ray's wait loop an empty replica and ``__del__`` the time to settle and close.

Ray (2.60) has no public hook for it. ``Replica._perform_graceful_shutdown`` — the
first thing a stopping replica runs — is wrapped once per process to call the
callbacks registered with ``on_drain`` before Ray's own drain. If the installed Ray
lacks that method, ``on_drain`` reports False and the ingress falls back to draining
in ``__del__`` alone (the behaviour before this hook; logged at WARNING).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_callbacks: list[Callable[[], None]] = []
_installed: bool | None = None


def _install() -> bool:
    global _installed
    if _installed is not None:
        return _installed
    try:
        from ray.serve._private import replica
    except ImportError:  # not under Ray Serve
        _installed = False
        return False
    original = getattr(replica.Replica, "_perform_graceful_shutdown", None)
    if original is None:
        log.warning("this Ray has no Replica._perform_graceful_shutdown: drain starts in __del__")
        _installed = False
        return False

    @functools.wraps(original)
    async def perform(self: Any) -> Any:
        fire()
        return await original(self)

    replica.Replica._perform_graceful_shutdown = perform  # type: ignore[method-assign]
    _installed = True
    return True


def on_drain(callback: Callable[[], None]) -> bool:
    """Call ``callback`` (sync, quick) when Ray Serve starts stopping this process's
    replica; False when that cannot be observed (then only ``__del__`` says it)."""
    if not _install():
        return False
    _callbacks.append(callback)
    return True


def fire() -> None:
    """Run (and forget) the registered callbacks; a failing one is logged, not raised."""
    pending = list(_callbacks)
    _callbacks.clear()
    for callback in pending:
        try:
            callback()
        except Exception:
            log.exception("a drain callback failed")
