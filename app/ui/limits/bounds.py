"""Every number of the public server's bounds, in one place (README, "Public server limits")."""
from __future__ import annotations

from dataclasses import dataclass

MiB = 1 << 20


@dataclass(frozen=True)
class PublicLimits:
    # sessions (gr.State of every visitor)
    sessions_max: int = 400                 # sessions held at once, all clients
    session_bytes_max: int = 256 * MiB      # their runs' records together (estimate: ``session_bytes``)
    sessions_per_client: int = 64           # beyond: the client's own least recent idle session goes, else 429
    new_sessions_per_minute: int = 60       # per client (a classroom behind one address); more get 429
    session_bytes_per_client: int = 64 * MiB  # one address's sessions together; beyond, new sessions and trace loads are refused
    idle_s: float = 300.0                   # unused this long: evictable when the server is full
    # paused step-mode runs (each holds a KV cache)
    paused_idle_s: float = 600.0            # ended after this long without a Step
    paused_bytes_max: int = 512 * MiB       # all paused runs' KV caches together
    # uploads (trace files) and the traces written for download
    upload_types: tuple = (".json",)
    uploads_per_minute: int = 20            # per client
    upload_disk_max: int = 512 * MiB        # uploads + traces on disk; oldest pruned, then refused
    # the queue
    queued_per_client: int = 2              # an address's events waiting for one worker (the engine's) at once
    # requests and connections
    body_bytes_max: int = 1 * MiB           # any request but an upload: refused (413) before it is parsed
    streams_per_client: int = 128           # open event streams and heartbeats of one address
    unknown_polls_per_minute: int = 30      # polls for sessions the queue does not know, per address (then 429)
    trusted_proxies: str = ""               # "" none; "N": N proxy hops; "a, b/24": the proxies' addresses
    header_timeout_s: float = 10.0          # a request's head must arrive within this
    body_timeout_s: float = 120.0           # ... and its body within this
    reap_every_s: float = 1.0
