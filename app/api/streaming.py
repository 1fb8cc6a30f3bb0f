"""The streaming response of a chat or completion: Starlette's, plus settlement when
its body generator never ran."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


class SettledStream(StreamingResponse):
    """A streaming response that settles its request even when its body generator
    never runs: Starlette awaits ``http.response.start`` and watches for a disconnect
    before it iterates, so a client that leaves right after admission would otherwise
    leave the reservation (and the replica's stream) alive."""

    def __init__(
        self, content: AsyncIterator[str], *, on_close: Callable[[], None], **kwargs: Any
    ) -> None:
        super().__init__(content, **kwargs)
        self._content = content
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()  # settles unless the generator already did
            aclose = getattr(self._content, "aclose", None)
            if aclose is not None:
                await aclose()
