"""Where clients' grammars compile: one thread, below decoding's CPU priority.

A structured-output schema compiles in llguidance with the GIL released, tens of
milliseconds of CPU for an ordinary schema and hundreds for one near the limits. On an
ordinary thread a compile takes a core from llama.cpp's decode threads, which wait for the
slowest of them at every matrix product, so on a small host one tenant's stream of costly
schemas (within its quota) slowed every other tenant's tokens several times over. On this
thread (Linux nice ``COMPILE_NICE``) a compile runs on the CPU that decoding leaves idle,
and compiles queue behind each other instead of running side by side; the compile-time
limit (``constraints.max_compile_ms``) counts the compile's own CPU time, so waiting for a
core is not held against a schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

COMPILE_NICE = 10
"""How much lower than the server's other threads the compile thread runs (Linux nice)."""

T = TypeVar("T")


def _lower_priority() -> None:
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or not permitted
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                       os.getpriority(os.PRIO_PROCESS, 0) + COMPILE_NICE)


_POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sluice-grammar",
                           initializer=_lower_priority)


async def run_compile(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` on the grammar thread, awaited without blocking the event loop."""
    return await asyncio.get_running_loop().run_in_executor(_POOL, fn, *args)


__all__ = ["COMPILE_NICE", "run_compile"]
