"""Quotas through HTTP on one replica (memory store): 429 with a Retry-After computed from
the bucket, tokens charged for what a request really used, refunds for requests that never
ran (rejected by the runtime, cancelled while queued), the concurrency cap, and the
per-tenant quota metrics."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from sluice.server.quota import MemoryQuotaStore, QuotaGate
from tests.server.live import (
    LiveServer,
    assert_error,
    config_with,
    metric_sum,
    scrape,
    synth_chat,
    synth_embed,
    wait_for,
)

AUTH = {"authorization": "Bearer key-t"}
OTHER = {"authorization": "Bearer key-other"}
EMBED = {"model": "synth-a", "input": "hello there"}


def tenant_server(serve: Callable[..., LiveServer], limits: dict[str, Any], *,
                  models: list[dict[str, Any]] | None = None, **sections: Any) -> LiveServer:
    """A server where tenant ``t`` (key ``key-t``) has ``limits`` and ``other`` has none;
    ``/metrics`` open to the tests' scrapes."""
    sections.setdefault("server", {"open_metrics": True})
    return serve(config_with(
        models=models or [synth_chat(), synth_embed()],
        tenants=[{"id": "t", "api_keys": ["key-t"], "limits": limits},
                 {"id": "other", "api_keys": ["key-other"]}],
        **sections,
    ))


def gate(live: LiveServer) -> QuotaGate:
    return live.server.config.app.state.ctx.quota  # type: ignore[no-any-return,union-attr]


def memory_store(live: LiveServer) -> MemoryQuotaStore:
    inner = gate(live).store.inner  # type: ignore[attr-defined]
    assert isinstance(inner, MemoryQuotaStore)
    return inner


def completion(max_tokens: int, prompt: str = "hello world") -> dict[str, Any]:
    return {"model": "synth-chat", "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0}


def test_request_rate_429_with_retry_after_from_the_bucket(
    serve: Callable[..., LiveServer],
) -> None:
    live = tenant_server(serve, {"requests_per_s": 0.1, "burst": 2})
    with live.client(headers=AUTH) as c:
        for _ in range(2):
            assert c.post("/v1/embeddings", json=EMBED).status_code == 200
        r = c.post("/v1/embeddings", json=EMBED)
        err = assert_error(r, 429, code="quota", type="rate_limit_exceeded")
        # One request refills in (1 - ~0) / 0.1 = ~10 s: computed, rounded up.
        assert r.headers["retry-after"] == "10"
        assert r.headers["x-sluice-quota-limit"] == "requests"
        assert "0.1/s" in err["message"] and "burst 2" in err["message"]
        with live.client(headers=OTHER) as other:  # another tenant is not touched
            assert other.post("/v1/embeddings", json=EMBED).status_code == 200
        assert_error(c.post("/v1/embeddings", json=EMBED,
                            headers={"authorization": "Bearer nope"}), 401)
        samples = scrape(c)
    assert metric_sum(samples, "sluice_quota_rejections_total", tenant="t",
                      limit="requests") == 1
    assert metric_sum(samples, "sluice_rejections_total", tenant="t", reason="quota") == 1
    assert metric_sum(samples, "sluice_requests_total", tenant="t", state="rejected") == 1
    assert metric_sum(samples, "sluice_admitted_total", tenant="t") == 2
    assert metric_sum(samples, "sluice_requests_total", tenant="t", state="completed") == 2
    assert metric_sum(samples, "sluice_quota_remaining", tenant="t", limit="requests") < 1
    assert metric_sum(samples, "sluice_quota_fallback") == 0
    assert "other" not in {labels.get("tenant") for labels, _ in
                           samples.get("sluice_quota_rejections_total", [])}


def test_a_tenant_past_its_rate_is_refused_before_its_body_is_read(
    serve: Callable[..., LiveServer],
) -> None:
    """Once the store has said the bucket is empty, the next POST gets its 429 from the
    headers alone, in its API's shape: a body that is not even JSON is not a 400 (it was
    never parsed), and it counts as one rejected request. Another tenant is served."""
    live = tenant_server(serve, {"requests_per_s": 0.01, "burst": 1})
    junk = b"{" * 200_000
    with live.client(headers=AUTH) as c:
        assert c.post("/v1/embeddings", json=EMBED).status_code == 200
        assert_error(c.post("/v1/embeddings", json=EMBED), 429, code="quota")  # the store
        for path in ("/v1/chat/completions", "/v1/embeddings", "/v1/messages", "/api/chat"):
            r = c.post(path, content=junk, headers={"content-type": "application/json"})
            assert r.status_code == 429, (path, r.text)
            assert int(r.headers["retry-after"]) >= 1
            assert r.headers["x-sluice-quota-limit"] == "requests"
            body = r.json()
            if path == "/api/chat":
                assert "request rate" in body["error"], body
            elif path == "/v1/messages":
                assert body["error"]["type"] == "rate_limit_error", body
            else:
                assert body["error"]["code"] == "quota", body
        with live.client(headers=OTHER) as other:
            assert other.post("/v1/embeddings", json=EMBED).status_code == 200
        samples = scrape(c)
    assert metric_sum(samples, "sluice_requests_total", tenant="t", state="rejected") == 5
    assert metric_sum(samples, "sluice_quota_rejections_total", tenant="t",
                      limit="requests") == 5


def test_a_post_resolves_its_tenant_once(serve: Callable[..., LiveServer],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """QuotaPeekMiddleware resolves the key (one hash and compare against every stored key)
    and leaves the tenant in the scope; the route reads it there. A GET, which the
    middleware passes by, resolves it in the route; a bad key is tried by both, the route
    answering the 401."""
    live = tenant_server(serve, {"requests_per_s": 100.0, "burst": 100})
    auth = live.server.config.app.state.ctx.auth  # type: ignore[union-attr]
    resolved: list[str | None] = []
    real = auth.tenant_from_headers

    def counting(headers: Any) -> Any:
        resolved.append(headers.get("authorization"))
        return real(headers)

    monkeypatch.setattr(auth, "tenant_from_headers", counting)
    msg = [{"role": "user", "content": "hi"}]
    posts = [("/v1/embeddings", EMBED), ("/v1/completions", completion(2)),
             ("/v1/chat/completions", {"model": "synth-chat", "messages": msg, "max_tokens": 2}),
             ("/v1/messages", {"model": "synth-chat", "messages": msg, "max_tokens": 2}),
             ("/api/chat", {"model": "synth-chat", "messages": msg, "stream": False,
                            "options": {"num_predict": 2}}),
             ("/completion", {"prompt": "hi", "n_predict": 2})]
    with live.client(headers=AUTH) as c:
        for path, sent in posts:
            resolved.clear()
            r = c.post(path, json=sent)
            assert r.status_code == 200, (path, r.text)
            assert resolved == [AUTH["authorization"]], path
        resolved.clear()
        assert c.get("/v1/models").status_code == 200
        assert resolved == [AUTH["authorization"]]
        resolved.clear()
        assert_error(c.post("/v1/embeddings", json=EMBED,
                            headers={"authorization": "Bearer nope"}), 401)
        assert resolved == ["Bearer nope"] * 2
        samples = scrape(c)
    assert metric_sum(samples, "sluice_requests_total", tenant="t", state="completed") == 6


def test_tokens_are_charged_for_what_was_used(serve: Callable[..., LiveServer]) -> None:
    """120 tokens/min; each request reserves prompt + max_tokens = 103 but stops at EOS
    after a few tokens. Settled at completion, the second request fits; charged the
    estimate, it would wait ~45 s."""
    live = tenant_server(serve, {"tokens_per_min": 120},
                         models=[synth_chat(eos_at_pos=6), synth_embed()])
    with live.client(headers=AUTH) as c:
        used = []
        for i in range(2):
            r = c.post("/v1/completions", json=completion(100))
            assert r.status_code == 200, r.text
            usage = r.json()["usage"]
            assert usage["prompt_tokens"] == 3 and usage["completion_tokens"] < 10
            used.append(usage["prompt_tokens"] + usage["completion_tokens"])
            want_refunded = sum(103 - u for u in used)
            wait_for(lambda want=want_refunded: metric_sum(  # type: ignore[misc]
                scrape(c), "sluice_quota_tokens_total", tenant="t", kind="refunded") == want)
            assert i == 1 or memory_store(live).state("t").tokens.tokens > 103  # type: ignore[union-attr]
        samples = scrape(c)
    assert metric_sum(samples, "sluice_quota_tokens_total", tenant="t", kind="reserved") == 206
    remaining = metric_sum(samples, "sluice_quota_remaining", tenant="t", limit="tokens")
    assert 120 - 103 - used[0] - 1 < remaining < 120 - 103 - used[0] + 5
    # Served tokens by tenant (the runtime's counter) agree with the settlement.
    served = (metric_sum(samples, "sluice_tokens_total", tenant="t", kind="prompt")
              + metric_sum(samples, "sluice_tokens_total", tenant="t", kind="completion"))
    assert served == sum(used)


def test_a_request_larger_than_the_token_budget_is_400(serve: Callable[..., LiveServer]) -> None:
    live = tenant_server(serve, {"tokens_per_min": 50})
    with live.client(headers=AUTH) as c:
        r = c.post("/v1/completions", json=completion(100))
        err = assert_error(r, 400, code="too_large")
        assert "retry-after" not in r.headers and "50 tokens per minute" in err["message"]
        assert c.post("/v1/completions", json=completion(10)).status_code == 200


def test_many_inputs_are_one_request(serve: Callable[..., LiveServer]) -> None:
    live = tenant_server(serve, {"requests_per_s": 0.01, "burst": 1, "tokens_per_min": 600})
    with live.client(headers=AUTH) as c:
        r = c.post("/v1/embeddings", json={"model": "synth-a", "input": ["a b", "c", "d e f"]})
        assert r.status_code == 200 and len(r.json()["data"]) == 3
        assert_error(c.post("/v1/embeddings", json=EMBED), 429, code="quota")
        wait_for(lambda: metric_sum(scrape(c), "sluice_quota_tokens_total", tenant="t",
                                    kind="reserved") == 6)


def _level(live: LiveServer) -> float:
    state = memory_store(live).state("t")
    assert state is not None and state.requests is not None
    return state.requests.tokens


def test_requests_that_never_ran_are_refunded(serve: Callable[..., LiveServer]) -> None:
    """Burst 4, no refill to speak of. Three long requests fill the worker, its inbox and
    the queue; the fourth is refused by the runtime (503 queue_full) and gives its quota
    back. The clients then hang up: the two that never started give theirs back too, the
    running one keeps its request and pays for the tokens it used."""
    live = tenant_server(
        serve, {"requests_per_s": 0.001, "burst": 4, "tokens_per_min": 6000},
        models=[synth_chat(step_fixed_s=0.05, n_seq_max=1)],
        workers={"count": 1, "inbox_capacity": 1}, scheduling={"queue_capacity": 1})

    async def scenario() -> None:
        async with live.async_client(headers=AUTH) as c:
            tasks = []
            # One at a time: running, then in the worker's inbox, then in the queue.
            for where in ((0, (0,)), (0, (1,)), (1, (1,))):
                tasks.append(asyncio.create_task(c.post("/v1/completions",
                                                        json=completion(60))))
                await asyncio.to_thread(wait_for, lambda where=where: (
                    (live.runtime.snapshot().queue_depth,
                     live.runtime.snapshot().inbox_depths) == where
                    and live.runtime.snapshot().live_requests == len(tasks)))
            r = await c.post("/v1/completions", json=completion(60))
            assert_error(r, 503, code="queue_full")
            await asyncio.to_thread(wait_for, lambda: math.isclose(_level(live), 1.0,
                                                                   abs_tol=0.05))
            # The queued and the inbox one hang up first, then the running one: cancelled
            # the other way round, the inbox one could start in the freed slot before its
            # own hang-up was seen (on a loaded host), and then rightly keep its request.
            for t in reversed(tasks):
                t.cancel()
                await asyncio.sleep(0.2)
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(scenario())
    with live.client() as c:
        wait_for(lambda: c.get("/status.json").json()["live_requests"] == 0)
    wait_for(lambda: math.isclose(_level(live), 3.0, abs_tol=0.05))
    state = memory_store(live).state("t")
    assert state is not None and state.in_flight == 0
    with live.client() as c:
        samples = scrape(c)
    reserved = metric_sum(samples, "sluice_quota_tokens_total", tenant="t", kind="reserved")
    refunded = metric_sum(samples, "sluice_quota_tokens_total", tenant="t", kind="refunded")
    assert reserved == 4 * 63
    assert 3 * 63 < refunded < 4 * 63  # all of three, part of the one that ran
    assert metric_sum(samples, "sluice_requests_total", tenant="t", state="cancelled") == 3


def test_concurrency_cap(serve: Callable[..., LiveServer]) -> None:
    live = tenant_server(serve, {"max_concurrent": 1},
                         models=[synth_chat(step_fixed_s=0.05)])

    async def scenario() -> None:
        async with live.async_client(headers=AUTH) as c:
            long = asyncio.create_task(c.post("/v1/completions", json=completion(100)))
            await asyncio.to_thread(wait_for, lambda: live.runtime.snapshot().live_requests)
            r = await c.post("/v1/completions", json=completion(1))
            assert_error(r, 429, code="quota")
            assert r.headers["retry-after"] == "1"
            assert r.headers["x-sluice-quota-limit"] == "concurrent"
            with httpx.Client(base_url=live.url, headers=OTHER) as other:
                assert other.post("/v1/completions", json=completion(1)).status_code == 200
            long.cancel()
            await asyncio.gather(long, return_exceptions=True)
            await asyncio.to_thread(wait_for, lambda: gate(live).in_flight.get("t") == 0)
            assert (await c.post("/v1/completions", json=completion(1))).status_code == 200

    asyncio.run(scenario())


def test_memory_backend_with_replicas_enforces_a_share(serve: Callable[..., LiveServer]) -> None:
    live = tenant_server(serve, {"requests_per_s": 0.01, "burst": 4}, quota={"replicas": 2})
    with live.client(headers=AUTH) as c:
        codes = [c.post("/v1/embeddings", json=EMBED).status_code for _ in range(3)]
    assert codes == [200, 200, 429]


def test_the_share_follows_the_live_replica_count(serve: Callable[..., LiveServer]) -> None:
    # Ray Serve replicas call set_replicas as the fleet grows and shrinks (sluice.cluster).
    live = tenant_server(serve, {"requests_per_s": 0.01, "burst": 6})
    gate(live).set_replicas(3)
    with live.client(headers=AUTH) as c:
        codes = [c.post("/v1/embeddings", json=EMBED).status_code for _ in range(3)]
        assert codes == [200, 200, 429]  # 1/3 of a burst of 6
        assert metric_sum(scrape(c), "sluice_quota_replicas") == 3
    with pytest.raises(ValueError, match="replicas"):
        gate(live).set_replicas(0)


def test_tokenize_and_detokenize_count_against_the_request_rate(
        serve: Callable[..., LiveServer]) -> None:
    live = tenant_server(serve, {"requests_per_s": 0.001, "burst": 2})
    key = {"Authorization": "Bearer key-t"}
    with live.client() as c:
        assert c.post("/tokenize", headers=key,
                      json={"model": "synth-chat", "content": "hello"}).status_code == 200
        assert c.post("/detokenize", headers=key,
                      json={"model": "synth-chat", "tokens": [5, 6]}).status_code == 200
        for path, body in (("/tokenize", {"model": "synth-chat", "content": "hello"}),
                           ("/detokenize", {"model": "synth-chat", "tokens": [5]}),
                           ("/v1/completions", completion(2))):
            r = c.post(path, headers=key, json=body)
            assert r.status_code == 429, (path, r.text)
            assert int(r.headers["retry-after"]) >= 1
        # another tenant is served
        r = c.post("/v1/completions", headers={"Authorization": "Bearer key-other"},
                   json=completion(2))
        assert r.status_code == 200


def test_detokenize_is_bounded_by_the_models_context(serve: Callable[..., LiveServer]) -> None:
    live = tenant_server(serve, {})
    room = 8 * 512  # synth_chat: 8 sequences of 512 tokens
    key = {"Authorization": "Bearer key-other"}
    with live.client() as c:
        r = c.post("/detokenize", headers=key,
                   json={"model": "synth-chat", "tokens": [5] * (room + 1)})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        r = c.post("/detokenize", headers=key, json={"model": "synth-chat", "tokens": [5] * room})
        assert r.status_code == 200
        assert c.post("/v1/completions", headers=key, json=completion(2)).status_code == 200
