"""Bounds that keep one visitor (or one script) from taking the public server from the others.

Gradio gives every browser session its own state and a bounded queue; left alone, a public
server still lets one client

* evict everyone: Gradio keeps the last N sessions and drops the least recently used, so a
  script that opens N new sessions (one request each) pushes every real visitor out;
* hold memory without bound: a paused step-mode run keeps its KV cache (tens of MB);
* overfill the queue: the queue's size is checked before the event's validator runs, and
  joins that arrive together all pass the check while the first is being validated;
* fill the disk with uploads, and hold connections open with headers that never end.

Each has a bound here, with the numbers in ``PublicLimits`` (README, "Public server limits"):

``BoundedStateHolder``   Gradio's session store with a byte budget besides the count, a cap on
                         sessions per client, a rate limit on each client's new sessions, and
                         eviction of *idle* sessions only (least recently used first): when
                         every session is active a new one is refused, none is displaced (and
                         a client over its own cap can displace only its own idle sessions).
``PausedRuns``           paused step-mode runs end after an idle time, and the oldest ends when
                         all of them together would hold more than a memory cap; the visitor
                         then reads why (``Session.expired``).
``bound_queue_joins``    the queue's cap counts the joins still being validated.
``LimitsMiddleware``     per-client identity for the above; uploads: size per request, .json
                         only, a per-client rate, and a disk budget over uploads and traces.
``reap_slow_connections`` closes connections whose request head (or body) does not arrive in
                         time; uvicorn, which Gradio runs, has no such timeout.

``app_kwargs(config)`` wires the middleware and a lifespan hook (which installs the session
store and starts the reaper) into Gradio's FastAPI app through ``launch(app_kwargs=...)``.

One module per mechanism; every name stays importable from ``app.ui.limits``:

=================  ==============================================================================
``bounds``         ``PublicLimits``: every number
``clients``        who is asking: ``CLIENT``, ``client_of``, ``trusted_proxies`` (proxies),
                   ``RateLimit``, ``Refused``
``sessions``       the sessions' memory budget: ``BoundedStateHolder``, ``session_bytes``,
                   ``admit_records``, ``release_memory``, ``step_bytes``
``paused``         ``PausedRuns``, ``kv_bytes``
``queue_share``    ``bound_queue_joins``
``body``           the request body cap
``streams``        open streams and polls for unknown sessions, per client
``uploads``        the upload folder, its disk budget and the checks of each upload
``middleware``     ``LimitsMiddleware``: the three above, per request
``connections``    ``reap_slow_connections``
``wiring``         ``app_kwargs``
=================  ==============================================================================
"""
from __future__ import annotations
from __future__ import annotations

from app.ui.limits.body import BodyCap  # noqa: F401
from app.ui.limits.bounds import MiB, PublicLimits  # noqa: F401
from app.ui.limits.clients import CLIENT, RateLimit, Refused, _in, _reply, client_of, trusted_proxies  # noqa: F401
from app.ui.limits.connections import reap_slow_connections  # noqa: F401
from app.ui.limits.middleware import LimitsMiddleware  # noqa: F401
from app.ui.limits.paused import PausedRuns, kv_bytes  # noqa: F401
from app.ui.limits.queue_share import bound_queue_joins  # noqa: F401
from app.ui.limits.sessions import (_sessions_in, _state_holder_class, admit_records,  # noqa: F401
                                    install_state_holder, records_bytes, release_memory, session_bytes,
                                    step_bytes)
from app.ui.limits.streams import StreamCaps, _is_stream  # noqa: F401
from app.ui.limits.uploads import (TRACE_PREFIX, UPLOAD_FOLDER, UploadLimits, _inside, disk_usage,  # noqa: F401
                                   gradio_temp_folder, make_room, own_upload_folder, upload_folder)
from app.ui.limits.wiring import _release_after_evictions, app_kwargs  # noqa: F401
