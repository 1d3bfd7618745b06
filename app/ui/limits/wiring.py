"""``app_kwargs(config)``: every bound wired into Gradio's FastAPI app through
``launch(app_kwargs=...)``: the middleware, and a lifespan hook that installs the session store,
points uploads at the app's own folder and starts the connection reaper."""
from __future__ import annotations

import asyncio
import contextlib

from app.ui.limits.bounds import PublicLimits
from app.ui.limits.connections import reap_slow_connections
from app.ui.limits.middleware import LimitsMiddleware
from app.ui.limits.sessions import install_state_holder, release_memory
from app.ui.limits.uploads import own_upload_folder


def app_kwargs(config, trace_dirs=()) -> dict:
    """For ``demo.launch(app_kwargs=...)``: the middleware, and a lifespan hook that installs
    the session store and starts the connection reaper once Gradio's app exists."""
    from starlette.middleware import Middleware

    limits = config.public_limits

    @contextlib.asynccontextmanager
    async def lifespan(app):
        blocks = app.get_blocks()
        holder = install_state_holder(app, blocks, limits)
        own_upload_folder(app, trace_dirs)
        loop = asyncio.get_running_loop()
        reaper = loop.create_task(reap_slow_connections(lambda: getattr(blocks, "server", None), limits))
        releaser = loop.create_task(_release_after_evictions(holder, limits))
        try:
            yield
        finally:
            reaper.cancel()
            releaser.cancel()

    return {"middleware": [Middleware(LimitsMiddleware, limits=limits, max_file_bytes=config.trace_max_bytes,
                                      trace_dirs=trace_dirs)],
            "lifespan": lifespan}


async def _release_after_evictions(holder, limits: PublicLimits) -> None:
    """After sessions were evicted or expired, hand their memory back (``release_memory``, off
    the loop); ``holder.releases`` counts the releases done."""
    while True:
        await asyncio.sleep(max(limits.reap_every_s, 1.0))
        if not holder.released:
            holder.released = True
            with contextlib.suppress(Exception):
                await asyncio.to_thread(release_memory)
            holder.releases += 1
