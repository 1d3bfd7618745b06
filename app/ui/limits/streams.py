"""Streams and polls: each client's open event streams and heartbeats are capped, and polls
for sessions the queue does not know are answered at once, rate-limited (``StreamCaps``, part
of ``LimitsMiddleware``)."""
from __future__ import annotations

from app.ui.limits.clients import CLIENT, Refused


def _is_stream(path: str) -> bool:
    return path.rstrip("/").endswith("/queue/data") or "/heartbeat/" in path


class StreamCaps:
    """``LimitsMiddleware``'s caps on event streams: polls for sessions the queue does not know
    are answered briefly (rate-limited), and each client's open streams are counted. Needs
    ``limits``, ``app``, ``unknown_polls`` (a ``RateLimit``) and ``streams``."""

    async def _stream(self, scope, receive, send):
        client = CLIENT.get()
        if scope["path"].rstrip("/").endswith("/queue/data") and not self._known_session(scope):
            if not self.unknown_polls.allow(client):
                raise Refused(429, "too many polls for unknown sessions from this address: wait a minute")
            raise Refused(404, "unknown session: join the queue first")
        if client is not None and self.streams[client] >= self.limits.streams_per_client:
            raise Refused(429, f"too many open connections from this address (at most "
                               f"{self.limits.streams_per_client})")
        self.streams[client] += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.streams[client] -= 1
            if not self.streams[client]:
                del self.streams[client]

    @staticmethod
    def _known_session(scope) -> bool:
        from urllib.parse import parse_qs

        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        session_hash = (query.get("session_hash") or [""])[0]
        try:
            queue = scope["app"].get_blocks()._queue
            return session_hash in queue.pending_messages_per_session
        except Exception:  # noqa: BLE001 — not a Gradio app we know: let it answer
            return True
