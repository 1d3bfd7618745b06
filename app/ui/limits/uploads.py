"""Uploads (trace files) and the traces written for download: the app's own folder inside
Gradio's temporary folder (``upload_folder``, installed by ``own_upload_folder``), its disk
budget (``make_room``), and the middleware's checks of each upload (``UploadLimits``: size,
rate, disk, file type; Gradio's ``/upload`` takes any file type, and keeps it an hour)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time

from app.ui.limits.clients import CLIENT, Refused, _reply

UPLOAD_FOLDER = "eagle-lens-uploads"      # the app's own, inside Gradio's temporary folder
TRACE_PREFIX = "eagle-lens-trace-"       # the traces written for download (handlers.replay.write_trace)


def gradio_temp_folder() -> str:
    """Gradio's temporary folder by Gradio's own rule ($GRADIO_TEMP_DIR, else <tmp>/gradio),
    without importing Gradio (``own_upload_folder`` checks it against Gradio's at launch)."""
    import tempfile
    from pathlib import Path

    return os.environ.get("GRADIO_TEMP_DIR") or str((Path(tempfile.gettempdir()) / "gradio").resolve())


def upload_folder() -> str:
    """The app's own folder: the visitors' uploads and the traces written for download.

    Gradio serves a file only from its upload folder (``app.uploaded_file_dir``, this one once
    ``own_upload_folder`` ran) or a path allowed at launch; a file returned from an event that
    is outside Gradio's temporary folder is first copied into that folder's top (outside this
    one), where it would not be served. A trace written here is served as it is, and counted
    and pruned with the uploads."""
    return os.path.join(gradio_temp_folder(), UPLOAD_FOLDER)


def disk_usage(folders) -> list[tuple[float, int, str]]:
    """(mtime, size, path) of every file under ``folders``, each a folder or (folder, name
    prefix): only the files whose name starts with the prefix. A file under two of the
    folders (the traces' folder inside the uploads') is listed once."""
    files, seen = [], set()
    for folder in folders:
        folder, prefix = folder if isinstance(folder, tuple) else (folder, "")
        for root, _, names in os.walk(folder):
            for name in names:
                path = os.path.join(root, name)
                if not name.startswith(prefix) or os.path.realpath(path) in seen:
                    continue
                with contextlib.suppress(OSError):
                    st = os.stat(path)
                    files.append((st.st_mtime, st.st_size, path))
                    seen.add(os.path.realpath(path))
    return files


def make_room(folders, budget: int, min_age_s: float = 60.0) -> bool:
    """Delete the oldest files (each older than ``min_age_s``: a trace just written for a
    download stays) until the folders hold at most ``budget`` bytes; True if they then do.
    Only files under ``folders`` (``disk_usage``) are counted and deleted."""
    files = sorted(disk_usage(folders))
    total = sum(size for _, size, _ in files)
    cutoff = time.time() - min_age_s
    for mtime, size, path in files:
        if total <= budget:
            break
        if mtime < cutoff:
            with contextlib.suppress(OSError):
                os.remove(path)
                total -= size
    return total <= budget


def own_upload_folder(app, trace_dirs=()) -> str:
    """Point Gradio's uploads at the app's own folder (``upload_folder``), so that pruning it
    never touches another app's files or Gradio's cached copies. Gradio serves only the files
    in that folder: a folder of traces for download (``trace_dirs``) must lie inside it, or
    every download would be refused (RuntimeError here, at launch, instead)."""
    from gradio.utils import get_upload_folder     # lazy: app.ui.limits loads without gradio (~16 s)

    folder = os.path.join(get_upload_folder(), UPLOAD_FOLDER)
    wrong = [d for d in trace_dirs if not _inside(d, folder)]
    if wrong:
        raise RuntimeError(f"traces for download are written to {wrong[0]}, outside the folder Gradio serves "
                           f"files from ({folder}): write them under limits.upload_folder()")
    os.makedirs(folder, exist_ok=True)
    app.uploaded_file_dir = folder
    return folder


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([path, folder]) == folder


class UploadLimits:
    """``LimitsMiddleware``'s bounds on uploads: size per request, a per-client rate, the disk
    budget (``make_room``) and .json files only. Needs ``limits``, ``app``,
    ``max_request_bytes``, ``uploads`` (a ``RateLimit``) and ``trace_dirs``."""

    async def _upload(self, scope, receive, send):
        headers = dict(scope.get("headers") or ())
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_request_bytes):
            raise Refused(413, f"an upload may be at most {self.max_request_bytes} bytes")
        if not self.uploads.allow(CLIENT.get()):
            raise Refused(429, f"too many uploads from this address (at most {self.limits.uploads_per_minute} a minute)")
        folders = [scope["app"].uploaded_file_dir, *((d, TRACE_PREFIX) for d in self.trace_dirs)]
        if not await asyncio.to_thread(make_room, [f for f in folders if os.path.isdir(f if isinstance(f, str) else f[0])],
                                       self.limits.upload_disk_max - self.max_request_bytes):
            raise Refused(507, "the server's upload space is full: try again later")

        received = [0]

        async def counted_receive():
            message = await receive()
            if message["type"] == "http.request":
                received[0] += len(message.get("body", b""))
                if received[0] > self.max_request_bytes:
                    return {"type": "http.disconnect"}          # the parser fails: nothing is kept
            return message

        start, body = None, []

        async def held_send(message):          # hold the (small) answer until its file names are checked
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            body.append(message.get("body", b""))
            if not message.get("more_body", False):
                await self._answer(start, b"".join(body), send)

        await self.app(scope, counted_receive, held_send)

    async def _answer(self, start, body: bytes, send):
        if start is not None and start["status"] == 200:
            try:
                paths = json.loads(body)
            except ValueError:
                paths = []
            wrong = [p for p in paths if isinstance(p, str) and not p.lower().endswith(self.limits.upload_types)]
            if wrong:
                for p in paths:
                    with contextlib.suppress(OSError, TypeError):
                        os.remove(p)
                await _reply(send, 415, f"only {', '.join(self.limits.upload_types)} files can be uploaded here")
                return
        await send(start)
        await send({"type": "http.response.body", "body": body})
