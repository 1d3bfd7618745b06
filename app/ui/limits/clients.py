"""Who is asking: the client's address (``client_of``: the peer's own, or the X-Forwarded-For
entry a trusted proxy added, ``trusted_proxies``), set per request in ``CLIENT`` by
``LimitsMiddleware``; a per-client rate limit; ``Refused``, a request this server will not take
now, and its HTTP answer."""
from __future__ import annotations

import contextvars
import ipaddress
import json
import threading
import time
from collections import defaultdict, deque

CLIENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("eagle_lens_client", default=None)


def trusted_proxies(spec: str) -> tuple[int, tuple]:
    """(hops, networks) of a ``trusted_proxies`` setting: "" trusts no proxy, "N" the last N
    hops whatever their address (a platform's proxies that every request passes through),
    "10.0.0.1, 10.1.0.0/16" the peers with these addresses (and X-Forwarded-For entries they
    added). ValueError for anything else."""
    spec = (spec or "").strip()
    if not spec:
        return 0, ()
    if spec.isdigit():
        if not 0 <= int(spec) <= 8:
            raise ValueError(f"trusted_proxies: at most 8 hops, got {spec}")
        return int(spec), ()
    try:
        # strict: "10.0.0.1/8" (host bits set) is a typo for an address or a network, not a guess to make
        return 0, tuple(ipaddress.ip_network(part.strip()) for part in spec.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"trusted_proxies must be a hop count or a list of addresses / networks (a network's "
                         f"host bits zero, e.g. 10.0.0.0/8), got {spec[:80]!r}") from None


def _in(address: str | None, networks) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except (TypeError, ValueError):
        return False
    return any(ip in net for net in networks)


def client_of(scope, trusted: tuple[int, tuple] = (0, ())) -> str | None:
    """The client's address: the peer's own, unless the peer is a trusted proxy (``trusted``,
    from ``trusted_proxies``); then the X-Forwarded-For entry that the outermost trusted proxy
    added. Entries a client sends itself come before those, so they cannot be forged."""
    peer = (scope.get("client") or (None,))[0]
    hops, networks = trusted
    if not hops and not (networks and _in(peer, networks)):
        return peer
    entries = []
    for name, value in scope.get("headers") or ():
        if name == b"x-forwarded-for":
            entries += [e.strip() for e in value.decode("latin-1").split(",")]
    entries = [e[:64] for e in entries if e]
    if hops:                                  # the entry the outermost of ``hops`` proxies added
        return entries[-hops] if len(entries) >= hops else peer
    for entry in reversed(entries):           # walk back over the trusted proxies
        if not _in(entry, networks):
            return entry
    return entries[0] if entries else peer


class RateLimit:
    """At most ``per_minute`` events per key in any 60 s."""

    def __init__(self, per_minute: int):
        self.per_minute = per_minute
        self._times: dict[str, deque] = defaultdict(deque)
        self._lock = threading.Lock()

    def allow(self, key: str | None, now: float | None = None) -> bool:
        if key is None:
            return True
        now = time.monotonic() if now is None else now
        with self._lock:
            times = self._times[key]
            while times and now - times[0] > 60.0:
                times.popleft()
            if len(times) >= self.per_minute:
                return False
            times.append(now)
            if len(self._times) > 10_000:            # forget clients gone quiet
                for k in [k for k, t in self._times.items() if not t or now - t[-1] > 60.0]:
                    del self._times[k]
            return True


class Refused(ValueError):
    """A request this server will not take now; ``status`` is its HTTP status. A ValueError,
    so that inside an event the page shows its message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


async def _reply(send, status: int, message: str):
    body = json.dumps({"detail": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
