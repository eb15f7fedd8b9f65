"""Two sluice replicas on a local Ray Serve, synthetic models, one app for the module.

- The OpenAI API and streaming through Serve's proxy, with sluice's decision headers and
  ``x-sluice-replica``.
- Prefix routing: requests land on the home the consistent-hash ring predicts for their
  system prompt; residency routing: a model goes where it is resident, not where a tie
  of loads would send it.
- Bounded admission: with every replica full the router spills the home's overflow onto
  the other replica, then the front end answers 503 ``queue_full`` with a Retry-After.
- Quotas hold across the replicas through a real Redis; each replica follows the live
  replica count for its fallback share.
- A replica killed mid-stream fails only its own stream; the next requests go to the
  survivor. (Last: it changes the replica set.)
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from sluice.cluster.hints import prompt_text
from sluice.policy.queues.replica_router import HashRing, prefix_fingerprint
from tests.cluster.conftest import LocalRay
from tests.cluster.raylocal import (
    SYSTEM,
    auth,
    chat_body,
    cluster_config,
    deploy,
    replica_actors,
    replica_stats,
    undeploy,
    wait_until,
)
from tests.server.live import sse_data
from tests.tenants.redisproc import RedisProcess

pytestmark = pytest.mark.timeout(300)

APP = "sluice-fixed"
MAX_ONGOING = 4
MAX_QUEUED = 4


@pytest.fixture(scope="module")
def fixed_app(local_ray: LocalRay, cluster_redis: RedisProcess) -> Iterator[str]:
    config = cluster_config(
        {"app_name": APP, "min_replicas": 2, "max_replicas": 2,
         "max_ongoing_requests": MAX_ONGOING, "max_queued_requests": MAX_QUEUED},
        redis_url=cluster_redis.url)
    deploy(config)
    try:
        yield local_ray.url
    finally:
        undeploy(config)


def replica_ids() -> list[str]:
    return sorted(replica_actors(APP))


def home_of(system: str) -> str:
    """Where the affinity router sends a chat with this system prompt when both replicas
    are idle and hold the model: the first replica on the key's ring walk."""
    text = prompt_text("/v1/chat/completions", chat_body(system, "x"))
    key = prefix_fingerprint("synth-chat", text, 64)
    assert key is not None
    return HashRing(replica_ids(), 64).walk(key)[0]


def prompts_with_distinct_homes() -> dict[str, str]:
    """A system prompt homed on each replica: replica id → system prompt."""
    found: dict[str, str] = {}
    for i in range(64):
        system = f"[app {i}] " + SYSTEM
        found.setdefault(home_of(system), system)
        if len(found) == 2:
            return found
    raise AssertionError("no prompt homed on each replica")


def test_openai_streaming_through_the_proxy_with_decision_headers(fixed_app: str) -> None:
    client = openai.OpenAI(base_url=f"{fixed_app}/v1", api_key="key-open", max_retries=0)
    stream = client.chat.completions.create(
        model="synth-chat", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip() and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 6

    with httpx.Client(base_url=fixed_app, timeout=30) as c, c.stream(
            "POST", "/v1/chat/completions", headers=auth(),
            json=chat_body("be brief", "hi", stream=True)) as r:
        assert r.status_code == 200
        events = sse_data(r.iter_lines())
    assert events[-1] == "[DONE]"
    assert r.headers["x-sluice-replica"] in replica_ids()
    assert r.headers["x-sluice-replica-route"].startswith("resident, least loaded")
    for name in ("x-sluice-request-id", "x-sluice-tenant", "x-sluice-worker", "x-request-id"):
        assert name in r.headers, name
    assert "," not in r.headers["x-request-id"]  # one id, not the proxy's and the replica's


def test_requests_go_to_their_prefix_home(fixed_app: str) -> None:
    homes = prompts_with_distinct_homes()
    with httpx.Client(base_url=fixed_app, timeout=30, headers=auth()) as c:
        for replica, system in homes.items():
            for user in ("When is my invoice due?", "Refund please", "Thanks"):
                r = c.post("/v1/chat/completions", json=chat_body(system, user))
                assert r.status_code == 200, r.text
                assert r.headers["x-sluice-replica"] == replica
                assert "prefix home" in r.headers["x-sluice-replica-route"]
        # A prompt shorter than the prefix window has no key: least loaded, lowest id.
        r = c.post("/v1/chat/completions", json=chat_body("short", "q"))
        assert r.headers["x-sluice-replica"] == replica_ids()[0]


def test_a_model_goes_where_it_is_resident(fixed_app: str) -> None:
    low, high = replica_ids()
    actors = replica_actors(APP)

    async def scenario() -> None:
        # Keep the lowest-id replica busy, so least-loaded puts the first embedding request
        # on the other one, which loads the model.
        async with httpx.AsyncClient(base_url=fixed_app, timeout=60, headers=auth()) as c, \
                c.stream("POST", "/v1/chat/completions", json=chat_body(
                    "short", "long answer", max_tokens=120, stream=True)) as busy:
            assert busy.headers["x-sluice-replica"] == low
            r = await c.post("/v1/embeddings", json={"model": "synth-a", "input": "x"})
            assert r.status_code == 200 and r.headers["x-sluice-replica"] == high
            assert r.headers["x-sluice-replica-route"].startswith("fits free memory")
            async for _ in busy.aiter_bytes():
                pass

    asyncio.run(scenario())
    wait_until(lambda: "synth-a" in replica_stats(actors[high])["resident"], 10,
               "the loading replica to report synth-a resident")
    time.sleep(0.6)  # two routing-stats periods: the router has seen the report
    with httpx.Client(base_url=fixed_app, timeout=30, headers=auth()) as c:
        for i in range(4):  # both idle: a tie of loads would pick the lowest id
            r = c.post("/v1/embeddings", json={"model": "synth-a", "input": f"text {i}"})
            assert r.status_code == 200
            assert r.headers["x-sluice-replica"] == high
            assert r.headers["x-sluice-replica-route"].startswith("resident")
        models = {m["id"]: m for m in c.get("/v1/models").json()["data"]}
        assert models["synth-chat"]["resident"]
    assert "synth-a" not in replica_stats(actors[low])["resident"]


def test_full_replicas_spill_then_the_front_end_answers_503(fixed_app: str) -> None:
    n = 24

    async def one(c: httpx.AsyncClient) -> tuple[int, dict[str, str], str]:
        # 250 tokens at 20 ms: each holds its replica for 5 s, longer than the flood takes
        # to arrive, so the bound below is on requests held at once.
        r = await c.post("/v1/chat/completions",
                         json=chat_body(SYSTEM, "tell me everything", max_tokens=250))
        return r.status_code, dict(r.headers), r.text

    async def flood() -> list[tuple[int, dict[str, str], str]]:
        async with httpx.AsyncClient(base_url=fixed_app, timeout=60, headers=auth()) as c:
            return list(await asyncio.gather(*(one(c) for _ in range(n))))

    results = asyncio.run(flood())
    codes = [status for status, _, _ in results]
    assert set(codes) <= {200, 503}, codes
    served = [h for status, h, _ in results if status == 200]
    refused = [(h, body) for status, h, body in results if status == 503]
    # Bounded: what the replicas hold, what waits in front of them, and (Serve counts a
    # request awaiting a replica's accept/reject answer as neither) at most one more
    # replica-full of requests in that handshake.
    assert len(served) <= 2 * (2 * MAX_ONGOING) + MAX_QUEUED
    assert len(refused) >= n - (2 * (2 * MAX_ONGOING) + MAX_QUEUED)
    for headers, body in refused:
        error = json.loads(body)["error"]
        assert error["code"] == "queue_full" and set(error) == {"message", "type", "param",
                                                                "code"}
        assert int(headers["retry-after"]) >= 1
    # One system prompt, so one home: its overflow went to the other replica.
    assert {h["x-sluice-replica"] for h in served} == set(replica_ids())
    # The overflow says so: a spill from the home (over the load bound, full, or refused
    # this request and retried by Serve), or the next replica on the prefix's ring.
    routes = [h["x-sluice-replica-route"] for h in served]
    assert any("prefix spill from" in r or "prefix ring" in r for r in routes), routes
    with httpx.Client(base_url=fixed_app, timeout=30, headers=auth()) as c:
        assert c.post("/v1/chat/completions", json=chat_body(SYSTEM, "ok?")).status_code == 200


def test_quotas_hold_across_replicas(fixed_app: str, cluster_redis: RedisProcess) -> None:
    actors = replica_actors(APP)
    wait_until(lambda: all(replica_stats(a)["quota_replicas"] == 2 for a in actors.values()),
               15, "each replica to count two replicas sharing the quotas")
    homes = prompts_with_distinct_homes()
    systems = list(homes.values())
    t0 = time.monotonic()
    outcomes: list[tuple[int, dict[str, str], str]] = []
    with httpx.Client(base_url=fixed_app, timeout=30, headers=auth("limited")) as c:
        for i in range(16):  # 4 per second for 4 s, alternating the two homes
            time.sleep(max(0.0, t0 + i * 0.25 - time.monotonic()))
            r = c.post("/v1/chat/completions", json=chat_body(systems[i % 2], f"q{i}"))
            outcomes.append((r.status_code, dict(r.headers), r.text))
    elapsed = time.monotonic() - t0
    admitted = [h for status, h, _ in outcomes if status == 200]
    # 1 request/s with a burst of 3, enforced once for both replicas (one replica alone
    # would admit about half of it; two separate buckets about twice).
    assert len(admitted) <= 3 + 1.0 * elapsed + 1
    assert len(admitted) >= 3
    assert {h["x-sluice-replica"] for status, h, _ in outcomes} == set(homes)
    for status, headers, body in outcomes:
        assert status in (200, 429), body
        if status == 429:
            assert json.loads(body)["error"]["code"] == "quota"
            assert int(headers["retry-after"]) >= 1


def test_a_killed_replica_fails_only_its_own_stream(fixed_app: str) -> None:
    import ray

    homes = prompts_with_distinct_homes()
    victim, survivor = sorted(homes)
    actors = replica_actors(APP)

    async def stream(c: httpx.AsyncClient, system: str, started: asyncio.Event
                     ) -> tuple[str, list[Any]]:
        async with c.stream("POST", "/v1/chat/completions", json=chat_body(
                system, "a long story", max_tokens=150, stream=True)) as r:
            assert r.status_code == 200
            lines: list[str] = []
            async for line in r.aiter_lines():
                lines.append(line)
                if line.startswith("data:"):
                    started.set()
            return r.headers["x-sluice-replica"], sse_data(lines)

    async def scenario() -> dict[str, list[Any]]:
        async with httpx.AsyncClient(base_url=fixed_app, timeout=60, headers=auth()) as c:
            flags = {rid: asyncio.Event() for rid in homes}
            tasks = [asyncio.create_task(stream(c, homes[rid], flags[rid])) for rid in homes]
            await asyncio.wait_for(asyncio.gather(*(f.wait() for f in flags.values())), 30)
            ray.kill(actors[victim], no_restart=True)
            return dict(await asyncio.gather(*tasks))

    events = asyncio.run(scenario())
    lost, kept = events[victim], events[survivor]
    assert kept[-1] == "[DONE]" and kept[-2]["choices"][0]["finish_reason"] == "length"
    assert lost[-1] == "[DONE]" and lost[-2]["error"]["code"] == "replica_failed"
    assert all("error" not in e for e in kept if isinstance(e, dict))
    # The next requests, including those whose home was the dead replica, are served
    # elsewhere (by the survivor, or by the replacement Serve starts).
    with httpx.Client(base_url=fixed_app, timeout=60, headers=auth()) as c:
        for system in (homes[victim], homes[survivor], homes[victim]):
            r = c.post("/v1/chat/completions", json=chat_body(system, "still there?"))
            assert r.status_code == 200, r.text
            assert r.headers["x-sluice-replica"] != victim
