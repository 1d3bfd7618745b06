"""The request body cap: every POST, PUT or PATCH but an upload is read whole, at most
``body_bytes_max``, before the app parses any of it (``BodyCap``, part of ``LimitsMiddleware``)."""
from __future__ import annotations

from app.ui.limits.clients import Refused


class BodyCap:
    """``LimitsMiddleware``'s cap on a request's body (``body_bytes_max``, any request but an
    upload). Needs ``limits`` and ``app``."""

    async def _bounded_body(self, scope, receive, send):
        """Read the whole body (at most ``body_bytes_max``) before the app sees any of it: a
        larger one is refused with 413 without being parsed or kept."""
        cap = self.limits.body_bytes_max
        length = dict(scope.get("headers") or ()).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > cap):
            raise Refused(413, f"a request body may be at most {cap} bytes")
        messages, size = [], 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > cap:
                raise Refused(413, f"a request body may be at most {cap} bytes")
            if not message.get("more_body", False):
                break
        replay = iter(messages)

        async def buffered_receive():
            return next(replay, None) or await receive()

        await self.app(scope, buffered_receive, send)
