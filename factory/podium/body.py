"""How much of a request body Podium reads: a bound checked before any form is parsed.

Starlette parses a form of up to 1,000 fields of 1 MB each, so one POST could grow the server by
a gigabyte. Podium's largest honest form is a SQL query of `MAX_QUERY_CHARS` characters, percent-
encoded; `BodyLimit` refuses a declared length past `MAX_BODY_BYTES` before reading a byte, and
stops a body sent without one (chunked) as soon as it passes the bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.responses import PlainTextResponse

MAX_BODY_BYTES = 1 << 20
"""A 100,000-character query percent-encodes to at most ~900 kB; prompts are capped at 20,000 characters."""
MAX_FORM_FIELDS = 64
"""Fields of one form: the Generate form, the largest, has about a dozen (and at most 6 checkpoints count)."""
TOO_LARGE = f"the request body is over {MAX_BODY_BYTES >> 10} KiB; Podium's forms are smaller: shorten the query or prompt"


class _TooLarge(Exception):
    """Raised inside the app when the body read so far passes the bound; `BodyLimit` answers it with a 413."""


class BodyLimit:
    """ASGI middleware: a request body over `max_bytes` is answered with 413 and never read past the bound."""

    def __init__(self, app: Any, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Mapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"").decode("latin-1").strip()
        if declared and (not declared.isdigit() or len(declared) > 20 or int(declared) > self.max_bytes):
            await PlainTextResponse(TOO_LARGE, status_code=413)(scope, receive, send)
            return
        received, started = 0, False

        async def bounded_receive() -> Mapping[str, Any]:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _TooLarge
            return message

        async def watched_send(message: Mapping[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, bounded_receive, watched_send)
        except _TooLarge:
            if started:  # a page that streams before reading its body: none of Podium's does; end the connection
                raise
            await PlainTextResponse(TOO_LARGE, status_code=413)(scope, receive, send)
