"""The admin surface (``/admin``): load and unload models; the admin key is checked first."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fastapi import APIRouter, Path, Request

from sluice.engine.runtime import Runtime
from sluice.server.errors import APIError, public_text, unknown_model
from sluice.server.routes.common import ERROR_RESPONSES, ctx_of

log = logging.getLogger("sluice.server")
router = APIRouter(prefix="/admin", tags=["admin"])

MODEL_ID = Path(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


@router.post("/models/{model_id}/{action}", responses=ERROR_RESPONSES)
async def admin_model(
    request: Request,
    model_id: str = MODEL_ID,
    action: str = Path(pattern=r"^(load|unload)$"),
) -> dict[str, Any]:
    """Load a model onto a worker, or unload it everywhere (admin key required when set)."""
    ctx = ctx_of(request)
    ctx.auth.require_admin(request)
    if model_id not in ctx.runtime.specs:
        raise unknown_model(model_id)
    runtime: Runtime = ctx.runtime
    t0 = time.monotonic()
    try:
        results = await asyncio.to_thread(runtime.call_on_workers, model_id, action)
    except Exception as exc:
        log.warning("admin %s of %s failed: %s", action, model_id, exc)
        raise APIError(409, f"{action} failed: {public_text(str(exc))}",
                       code=f"{action}_failed") from None
    return {"model": model_id, "action": action, "results": results,
            "seconds": round(time.monotonic() - t0, 3)}
