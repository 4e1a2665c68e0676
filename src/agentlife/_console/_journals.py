"""An attempt's session journal as a download: masked line by line, bounded, only from this console's disk.

The file is named by the job's id and the session's file name, both checked: the id must be one that can
name a journal directory that is this disk's own (`journal_dir`: not a link out of the data directory),
and the name one of the session files `list_sessions` finds there (a symlink is never one, and the file is
opened without following one), so a request can read nothing but a journal. Each line is parsed and
masked whole (`Masker.whole`) and written again as JSON; a line that is not JSON (torn, or nested deeper
than orjson reads) is written as a masked string, in which the value after every quoted key named like a
credential is masked too (`Masker.broken_json`); one longer than `MAX_LINE` is left out
(``{"type": "LINE_TOO_LONG"}``): cut in pieces, a secret across a cut would be masked in neither. The
download stops after `MAX_DOWNLOAD` bytes read, with a last line saying so.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

import anyio
import orjson
from aiohttp import web

from agentlife._config import JOB_ID_PATTERN
from agentlife._console._data import BadRequest, journal_dir
from agentlife._exceptions import JobNotFound
from agentlife._jobs._mask import Masker
from agentlife._journal._writer import list_sessions

__all__ = ["MAX_DOWNLOAD", "MAX_LINE", "journal_path", "stream_journal"]

#: The most bytes of one journal a download reads.
MAX_DOWNLOAD = 64 * 1024 * 1024
#: How much is read (and masked) at a time.
_CHUNK = 256 * 1024
#: The longest journal line masked and sent (the journal writes none that long).
MAX_LINE = 4 * 1024 * 1024


def journal_path(data_dir: Path, job_id: str, session: str) -> Path:
    """The session journal ``session`` of ``job_id`` under ``data_dir``; `JobNotFound` when there is none."""
    if not JOB_ID_PATTERN.fullmatch(job_id) or job_id in (".", ".."):
        raise BadRequest("this job id cannot name a journal directory")
    if not session or len(session) > 200:
        raise BadRequest("a journal is named by its session file (?session=session_....jsonl)")
    directory = journal_dir(data_dir, job_id)
    for path in list_sessions(directory) if directory is not None else []:
        if path.name == session:
            return path
    raise JobNotFound(
        f"there is no journal {session!r} of job {job_id} on this console's disk"
        " (journals are read from its AGENTLIFE_DATA_DIR only)"
    )


async def stream_journal(
    request: web.Request, path: Path, masker: Masker, headers: Mapping[str, str]
) -> web.StreamResponse:
    """Send the journal at ``path`` masked, as an attachment, up to `MAX_DOWNLOAD` bytes of it."""
    try:  # a session file swapped for a link since it was listed is refused, not followed
        source = anyio.wrap_file(await anyio.to_thread.run_sync(_open_unfollowed, path))
    except OSError as exc:
        raise JobNotFound(f"the journal {path.name} cannot be read: {exc.strerror or exc}") from None
    response = web.StreamResponse(
        headers={
            **headers,
            "Content-Type": "application/x-ndjson; charset=utf-8",
            "Content-Disposition": f'attachment; filename="{path.parent.name}-{path.name}"',
        }
    )
    async with source:
        await response.prepare(request)
        read, rest, skipping = 0, b"", False
        while read < MAX_DOWNLOAD:
            chunk = await source.read(min(_CHUNK, MAX_DOWNLOAD - read))
            if not chunk:
                break
            read += len(chunk)
            if skipping:  # the rest of a line too long to mask whole: dropped, never cut and shown
                _, newline, chunk = chunk.partition(b"\n")
                if not newline:
                    continue
                skipping = False
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            out = b"".join(_masked(line, masker) for line in lines if line.strip())
            if len(rest) > MAX_LINE:
                # A secret cut in two by a split would be masked in neither half: the line is left out.
                out += orjson.dumps({"type": "LINE_TOO_LONG", "over_bytes": MAX_LINE}) + b"\n"
                rest, skipping = b"", True
            await response.write(out)
        if rest.strip() and not skipping:
            await response.write(_masked(rest, masker))
        if read >= MAX_DOWNLOAD and await source.read(1):
            note = {"type": "DOWNLOAD_TRUNCATED", "after_bytes": MAX_DOWNLOAD}
            await response.write(orjson.dumps(note) + b"\n")
    await response.write_eof()
    return response


def _open_unfollowed(path: Path) -> BinaryIO:
    """``path`` opened for reading; `OSError` (ELOOP) when it is a symlink."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    return os.fdopen(fd, "rb")


def _masked(line: bytes, masker: Masker) -> bytes:
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError:
        # Torn, or nested deeper than orjson reads: masked as text, the values under credential keys too.
        return orjson.dumps(masker.broken_json(line.decode("utf-8", "replace"), MAX_LINE)) + b"\n"
    return orjson.dumps(masker.whole(event), option=orjson.OPT_NON_STR_KEYS) + b"\n"
