"""``POST /slots/{id}?action=save|restore`` (llama-server's, with ``--slot-save-path``): a
slot's KV to or from a file in ``server.slot_save_path``, sent to the slot's worker as a
message and run on its thread between two engine steps (``sluice.engine.slots``); the
request body (``SlotActionRequest``) and the answer in llama-server's shape, its refusals
as ``APIError``s (the route renders them in llama-server's error shape)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field

from sluice.engine.continuous import ContinuousEngine
from sluice.engine.slots import SlotError, SlotResult, restore_slot, save_slot
from sluice.server.context import AppContext
from sluice.server.errors import APIError, bad_param, public_text
from sluice.server.schemas.base import _Body

log = logging.getLogger("sluice.server")

SLOT_ERRORS: dict[str, int] = {
    "slot_busy": 503,
    "slot_of_another_tenant": 403,
    "prefix_reuse_off": 409,
    "invalid_slot_file": 400,
    "slot_save_failed": 500,
}
"""Each ``SlotError`` code's HTTP status (a busy slot: 503 with Retry-After, as erase)."""


class SlotActionRequest(_Body):
    """llama-server's ``POST /slots/{id}?action=...`` body."""

    filename: str | None = Field(default=None, max_length=255)
    """The file in ``server.slot_save_path`` (save, restore): a plain name, no folders
    (checked by ``slot_file``, after whether slot files are on at all)."""
    model: str | None = Field(default=None, min_length=1, max_length=256)
    """The generative model whose slot it is (default: the default model)."""


def slot_file(ctx: AppContext, action: str, filename: str | None) -> Path:
    """The file a save or restore names, in the slot folder: 501 without one (as
    llama-server without ``--slot-save-path``), 400 without a ``filename``, 404 for a restore
    from a file that is not there, 400 for a name that is not plain (``is_plain_name``)."""
    try:
        folder = ctx.config.server.slot_folder()
    except ValueError as exc:  # checked at start: it went away since
        log.error("%s", exc)
        raise APIError(500, "The slot folder is missing.", type="server_error",
                       code="slot_folder_missing") from None
    if folder is None:
        raise APIError(501, "This server does not support slots action. Start it with "
                            "--slot-save-path (server.slot_save_path).", code="not_supported")
    if not filename:
        raise bad_param("filename", f"Slot {action} needs a filename")
    if not is_plain_name(filename):
        raise bad_param("filename", "Invalid filename: a plain file name, without folders, "
                                    "'..', spaces at either end or control characters")
    path = folder / filename
    if action == "restore" and not path.is_file():
        raise APIError(404, f"No saved slot {filename!r} in the slot folder", param="filename",
                       code="file_not_found")
    return path


def is_plain_name(filename: str) -> bool:
    """A file name that stays in its folder: no separator, no ``..``, not ``.``, no spaces
    at either end, no control characters."""
    return not (filename in ("", ".") or "/" in filename or "\\" in filename
                or ".." in filename or filename.strip() != filename
                or any(ord(c) < 32 for c in filename))


async def slot_file_action(ctx: AppContext, action: str, model: str, worker_id: int,
                           slot: int, path: Path, tenant: str, id_slot: int
                           ) -> dict[str, Any]:
    """Save ``slot`` of ``model`` on ``worker_id`` to ``path``, or restore it from there,
    for ``tenant``: llama-server's answer, with ``id_slot`` as the client named it."""
    fn = save_slot if action == "save" else restore_slot
    op = functools.partial(_run, fn, slot=slot, path=path, tenant=tenant)
    try:
        result: SlotResult = await asyncio.wrap_future(ctx.runtime.on_engine(model, worker_id,
                                                                             op))
    except SlotError as exc:
        status = SLOT_ERRORS[exc.code]
        if status >= 500 and exc.code != "slot_busy":
            log.error("slot %s of %s failed: %s", action, model, exc)
        raise APIError(status, public_text(str(exc)), code=exc.code,
                       param="filename" if exc.code == "invalid_slot_file" else None,
                       retry_after_s=1.0 if exc.code == "slot_busy" else None) from None
    except ValueError:  # unloaded, or its worker replaced, since the look
        raise APIError(503, f"Slot {id_slot} is not loaded now: GET /slots lists the slots",
                       code="slot_unavailable", retry_after_s=1.0) from None
    ms = result.seconds * 1000
    if action == "save":
        return {"id_slot": id_slot, "filename": path.name, "n_saved": result.n_tokens,
                "n_written": result.n_bytes, "timings": {"save_ms": ms}}
    return {"id_slot": id_slot, "filename": path.name, "n_restored": result.n_tokens,
            "n_read": result.n_bytes, "timings": {"restore_ms": ms}}


def _run(fn: Callable[[ContinuousEngine, int, Path, str], SlotResult],
         engine: ContinuousEngine, *, slot: int, path: Path, tenant: str) -> SlotResult:
    return fn(engine, slot, path, tenant)
