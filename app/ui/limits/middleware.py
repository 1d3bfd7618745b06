"""``LimitsMiddleware``: the ASGI middleware that sets ``CLIENT`` for each request and sends it
to its bound: the body cap (``body.py``), the streams and polls (``streams.py``), the uploads
(``uploads.py``)."""
from __future__ import annotations

from collections import defaultdict

from app.ui.limits.body import BodyCap
from app.ui.limits.bounds import PublicLimits
from app.ui.limits.clients import CLIENT, RateLimit, Refused, _reply, client_of, trusted_proxies
from app.ui.limits.streams import StreamCaps, _is_stream
from app.ui.limits.uploads import UploadLimits


class LimitsMiddleware(BodyCap, StreamCaps, UploadLimits):
    """ASGI middleware: sets ``CLIENT`` for the request, answers ``Refused`` with its status,
    caps every request's body before it is parsed, caps each client's open streams, answers
    polls for unknown sessions briefly (rate-limited), and bounds uploads (Gradio's
    ``/upload`` takes any file type, and keeps it an hour)."""

    def __init__(self, app, limits: PublicLimits, max_file_bytes: int, trace_dirs=()):
        self.app, self.limits = app, limits
        self.max_request_bytes = max_file_bytes + 64 * 1024       # one file and its multipart framing
        self.trace_dirs = tuple(trace_dirs)
        self.uploads = RateLimit(limits.uploads_per_minute)
        self.unknown_polls = RateLimit(limits.unknown_polls_per_minute)
        self.trusted = trusted_proxies(limits.trusted_proxies)
        self.streams: dict = defaultdict(int)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        token = CLIENT.set(client_of(scope, self.trusted))
        try:
            path = scope["path"].rstrip("/")
            if scope["method"] == "POST" and path.endswith("/upload"):
                await self._upload(scope, receive, send)
            elif scope["method"] in ("POST", "PUT", "PATCH"):
                await self._bounded_body(scope, receive, send)
            elif _is_stream(path):
                await self._stream(scope, receive, send)
            else:
                await self.app(scope, receive, send)
        except Refused as exc:
            await _reply(send, exc.status, str(exc))
        finally:
            CLIENT.reset(token)
