"""Autoscaling on sluice's own load signal, on the session's local Ray Serve.

One replica under a steady load of streams (sluice_load above the per-replica target)
becomes two; when the load falls to two long streams, one on each replica, the fleet goes
back to one — and the replica that leaves is drained first: its stream finishes whole.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from tests.cluster.conftest import LocalRay
from tests.cluster.raylocal import (
    auth,
    chat_body,
    cluster_config,
    deploy,
    replica_actors,
    running_replicas,
    undeploy,
    wait_until,
)
from tests.server.live import sse_data

pytestmark = pytest.mark.timeout(300)

APP = "sluice-autoscale"
LONG_TOKENS = 400  # 8 s at 20 ms a step: outlasts the downscale delay and the look-back


async def stream(c: httpx.AsyncClient, max_tokens: int) -> tuple[int, str, list[Any]]:
    async with c.stream("POST", "/v1/chat/completions", json=chat_body(
            "short", "go on", max_tokens=max_tokens, stream=True)) as r:
        lines = [line async for line in r.aiter_lines()]
        return r.status_code, r.headers.get("x-sluice-replica", ""), sse_data(lines)


def completed_whole(events: list[Any], tokens: int) -> bool:
    return (events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
            and not any("error" in e for e in events if isinstance(e, dict)))


def test_scales_up_under_load_and_down_with_a_drain(local_ray: LocalRay) -> None:
    config = cluster_config({
        "app_name": APP, "min_replicas": 1, "max_replicas": 2,
        "target_load_per_replica": 2.0, "upscale_delay_s": 0.5, "downscale_delay_s": 2.0,
        "look_back_period_s": 1.0})
    deploy(config)
    try:
        assert running_replicas(APP) == 1
        outcomes = asyncio.run(_scenario(local_ray.url))
    finally:
        undeploy(config)
    load_phase, long_streams, removed, seen_two = outcomes
    assert seen_two, "the fleet never reached two replicas"
    assert all(status == 200 for status, _, _ in load_phase + long_streams)
    assert all(completed_whole(events, 100) for _, _, events in load_phase)
    assert len({replica for _, replica, _ in long_streams}) == 2  # one on each replica
    assert all(completed_whole(events, LONG_TOKENS) for _, _, events in long_streams)
    # The replica that left was serving one of the long streams, which still finished.
    assert removed in {replica for _, replica, _ in long_streams}


async def _scenario(url: str) -> tuple[list[Any], list[Any], str, bool]:
    async with httpx.AsyncClient(base_url=url, timeout=120, headers=auth()) as c:
        # Load: six streams at a time (target 2 per replica) until a second replica runs.
        load: list[asyncio.Task[tuple[int, str, list[Any]]]] = []
        end = time.monotonic() + 90
        while running_replicas(APP) < 2 and time.monotonic() < end:
            load = [t for t in load if not t.done()] + load
            live = sum(1 for t in load if not t.done())
            for _ in range(6 - live):
                load.append(asyncio.create_task(stream(c, 100)))
            await asyncio.sleep(0.25)
        seen_two = running_replicas(APP) == 2
        before = set(replica_actors(APP))
        load_phase = list(await asyncio.gather(*set(load)))
        # The lull: two long streams, one per replica (least loaded: both idle, then one
        # holds the first) — load 2 for two replicas of target 2 asks for one.
        first = asyncio.create_task(stream(c, LONG_TOKENS))
        await asyncio.sleep(0.5)
        second = asyncio.create_task(stream(c, LONG_TOKENS))
        await asyncio.to_thread(wait_until, lambda: running_replicas(APP) == 1, 60,
                                "the fleet to shrink back to one replica", 0.2)
        # The leaving replica is out of the routing but alive while it drains its stream.
        assert len(replica_actors(APP)) == 2
        long_streams = list(await asyncio.gather(first, second))
        await asyncio.to_thread(wait_until, lambda: len(replica_actors(APP)) == 1, 60,
                                "the drained replica to exit", 0.2)
        after = set(replica_actors(APP))
    removed = before - after
    assert len(removed) == 1, (before, after)
    return load_phase, long_streams, removed.pop(), seen_two
