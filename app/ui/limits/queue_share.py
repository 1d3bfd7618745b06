"""The queue: its cap counts the joins still being validated, and each client gets a share of
it (``bound_queue_joins``)."""
from __future__ import annotations

from collections import defaultdict

from app.ui.limits.bounds import PublicLimits
from app.ui.limits.clients import CLIENT


def bound_queue_joins(queue, limits: PublicLimits | None = None) -> None:
    """Make Gradio's queue cap hold for joins that arrive together, and give each client a
    share of it.

    ``Queue.push`` checks ``len(queue) >= max_size``, then awaits the event's validator, and
    only then appends the event: every join that arrives while a validator runs passes the
    same check (40 simultaneous joins: 37-40 accepted against a cap of 32). Here a join
    reserves its place before the first await (the event loop runs one coroutine at a time,
    so check and reservation are atomic) and the cap counts the reservations too.

    A client (``CLIENT``, set by ``LimitsMiddleware`` for the join's request) may have at most
    ``limits.queued_per_client`` events waiting for the same worker (its reservations
    included): one visitor's runs cannot fill the queue ahead of everyone else.
    """
    push = queue.push
    pending = [0]
    per_client = limits.queued_per_client if limits is not None else None
    reserved: dict = defaultdict(int)          # (client, concurrency id) -> joins being validated

    def waiting(client, concurrency_id) -> int:
        q = queue.event_queue_per_concurrency_id.get(concurrency_id)
        events = q.queue if q is not None else ()
        return sum(getattr(e, "eagle_lens_client", None) == client for e in events) + reserved[(client, concurrency_id)]

    async def bounded_push(body, request, username):
        if queue.max_size is not None and len(queue) + pending[0] >= queue.max_size:
            return False, f"Queue is full. Max size is {queue.max_size}.", "queue_full"
        client = CLIENT.get()
        key = None
        if per_client is not None and client is not None:
            try:
                from gradio import route_utils      # lazy: app.ui.limits loads without gradio (~16 s)

                concurrency_id = route_utils.get_fn(queue.blocks, None, body).concurrency_id
            except Exception:  # noqa: BLE001 — an unknown fn: Gradio's own push answers it
                concurrency_id = None
            if concurrency_id is not None:
                if waiting(client, concurrency_id) >= per_client:
                    return (False, f"You already have {per_client} runs waiting: wait for them to finish (a "
                                   f"visitor may queue at most {per_client}).", "queue_full")
                key = (client, concurrency_id)
                reserved[key] += 1
        pending[0] += 1
        try:
            ok, event_id, kind = await push(body, request, username)
            event = queue.event_ids_to_events.get(event_id) if ok and isinstance(event_id, str) else None
            if event is not None:
                event.eagle_lens_client = client
            return ok, event_id, kind
        finally:
            pending[0] -= 1
            if key is not None:
                reserved[key] -= 1
                if not reserved[key]:
                    del reserved[key]

    queue.push = bounded_push
