"""Slow connections: ``reap_slow_connections`` closes connections whose request head (or body)
does not arrive in time; uvicorn, which Gradio runs, has no such timeout."""
from __future__ import annotations

import asyncio
import time
import weakref

from app.ui.limits.bounds import PublicLimits


async def reap_slow_connections(get_server, limits: PublicLimits) -> None:
    """Close HTTP connections whose request head has not arrived within ``header_timeout_s``
    (or whose body has not within ``body_timeout_s``).

    uvicorn arms its keep-alive timer only after a response: a connection that sends half a
    request head (or one byte a minute) is held for ever, and enough of them exhaust the
    server. A request head is complete when h11 has parsed it: the client's state leaves
    IDLE. The head's clock starts when the connection is first seen waiting, so an idle
    keep-alive connection is closed too (uvicorn's own 5 s timer usually does that first).
    Runs on the server's event loop, where transports may be closed.
    """
    import h11

    since: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    while True:
        await asyncio.sleep(limits.reap_every_s)
        server = get_server()
        if server is None:
            continue
        now = time.monotonic()
        for proto in list(getattr(server, "server_state", None).connections if server else ()):
            conn = getattr(proto, "conn", None)
            if not isinstance(conn, h11.Connection):
                continue             # a WebSocket, or another protocol: not ours to judge
            state = conn.their_state
            if state is h11.IDLE:
                limit = limits.header_timeout_s
            elif state is h11.SEND_BODY:
                limit = limits.body_timeout_s
            else:
                since.pop(proto, None)
                continue
            key = (state, id(getattr(proto, "cycle", None)))
            first = since.get(proto)
            if first is None or first[0] != key:
                since[proto] = (key, now)
            elif now - first[1] > limit and not proto.transport.is_closing():
                proto.transport.close()
