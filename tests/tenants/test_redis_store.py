"""The Redis store against a real redis-server: the Lua script decides exactly as the pure
rule does, state is shared between store instances (replicas), leases free dead slots, and
the failover store falls back, logs once, and reconnects by itself."""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.policy.capacity.quota import QuotaLimits
from sluice.server.quota import (
    FailoverQuotaStore,
    Hold,
    MemoryQuotaStore,
    QuotaBackendError,
    RedisQuotaStore,
    redact_url,
)
from tests.tenants.redisproc import RedisProcess, free_port, redis_binary

LIMITS = QuotaLimits(requests_per_s=2.0, request_burst=3.0, tokens_per_s=50.0,
                     token_capacity=300.0, max_concurrent=2)
_members = itertools.count()


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_redact_url() -> None:
    assert redact_url("redis://:secret@host:6379/0") == "redis://:***@host:6379/0"
    assert redact_url("redis://host:1/0") == "redis://host:1/0"


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(
    st.tuples(st.floats(0.0, 1.5),
              st.sampled_from(["reserve", "reserve", "release", "settle"]),
              st.integers(1, 320), st.booleans()),
    min_size=1, max_size=40,
))
def test_lua_script_decides_like_the_pure_rule(
    redis: RedisProcess, ops: list[tuple[float, str, int, bool]]
) -> None:
    """The same operations (reserve, settle, release) at the same (injected) times give the
    same decisions and levels from Redis and from memory."""
    redis.client().flushall()

    async def run() -> None:
        clock = _Clock()
        shared = RedisQuotaStore(redis.url, key_prefix="parity", clock=clock)
        local = MemoryQuotaStore(clock)
        held: list[Any] = []
        try:
            for gap, op, tokens, ran in ops:
                clock.now += gap
                if op == "settle":
                    if not held:
                        continue
                    hold_r, hold_m = held[0]
                    target = hold_m.charged_tokens * (0.6 if ran else 1.2)
                    got_s = await shared.settle(hold_r, target)
                    want_s = await local.settle(hold_m, target)
                    assert got_s.hold.charged_tokens == pytest.approx(
                        want_s.hold.charged_tokens, rel=1e-12)
                    assert (got_s.remaining_tokens is None) == (want_s.remaining_tokens is None)
                    if got_s.remaining_tokens is not None:
                        assert got_s.remaining_tokens == pytest.approx(
                            want_s.remaining_tokens, rel=1e-12, abs=1e-9)
                    held[0] = (got_s.hold, want_s.hold)
                    continue
                if op == "release":
                    if not held:
                        continue
                    hold_r, hold_m = held.pop(0)
                    refund = hold_m.charged_tokens * (0.3 if ran else 1.0)
                    await shared.release(hold_r, refund_request=not ran, refund_tokens=refund)
                    await local.release(hold_m, refund_request=not ran, refund_tokens=refund)
                    continue
                member = f"m{next(_members)}"
                got = await shared.reserve("t", LIMITS, float(tokens), member, 3600.0)
                want = await local.reserve("t", LIMITS, float(tokens), member, 3600.0)
                assert (got.ok, got.limit) == (want.ok, want.limit)
                assert got.retry_after_s == pytest.approx(want.retry_after_s, rel=1e-9,
                                                          abs=1e-9)
                assert got.remaining_requests == pytest.approx(want.remaining_requests,
                                                               rel=1e-12, abs=1e-9)
                assert got.remaining_tokens == pytest.approx(want.remaining_tokens,
                                                             rel=1e-12, abs=1e-9)
                assert got.in_flight == want.in_flight
                if got.ok:
                    held.append((got.hold, want.hold))
        finally:
            await shared.aclose()

    asyncio.run(run())


def test_two_stores_share_one_quota_on_redis_time(redis: RedisProcess) -> None:
    """Two replicas' stores (no injected clock: Redis's TIME) draw from one bucket; the key
    expires once the bucket would be full again."""
    limits = QuotaLimits(requests_per_s=0.5, request_burst=4.0)

    async def run() -> None:
        a = RedisQuotaStore(redis.url, key_prefix="shared")
        b = RedisQuotaStore(redis.url, key_prefix="shared")
        try:
            results = []
            for i in range(6):
                store = a if i % 2 == 0 else b
                results.append(await store.reserve("acme", limits, 1.0, f"m{i}", 60.0))
            assert [r.ok for r in results] == [True] * 4 + [False] * 2
            refused = results[-1]
            assert refused.limit == "requests"
            assert 1.5 < refused.retry_after_s <= 2.0  # (1 - ~0) / 0.5, less time passed
            bucket, _ = a.keys("acme")
            assert bucket == "shared:quota:{acme}:bucket"
            ttl_ms = redis.client().pttl(bucket)
            assert 8_000 < ttl_ms <= 9_000  # 4 requests at 0.5/s + 1 s
        finally:
            await a.aclose()
            await b.aclose()

    asyncio.run(run())


def test_a_settlement_gives_back_once_and_keeps_the_slot_and_lease(redis: RedisProcess) -> None:
    """Settling lowers the hold and refunds the difference at once; the request and the
    slot stay taken and the hold keeps its lease; settling higher takes nothing, and a
    settlement after the release gives nothing back."""
    limits = QuotaLimits(requests_per_s=0.01, request_burst=3.0, tokens_per_s=0.01,
                         token_capacity=100.0, max_concurrent=2)

    async def run() -> None:
        store = RedisQuotaStore(redis.url, key_prefix="settle")
        try:
            check = await store.reserve("t", limits, 80.0, "m1", 60.0)
            assert check.ok and check.hold is not None
            bucket, inflight = store.keys("t")
            client = redis.client()
            hold_key = store.hold_key("t", "m1")
            lease_ms = client.pttl(hold_key)
            settled = await store.settle(check.hold, 30.0)
            assert settled.hold.charged_tokens == 30.0
            assert settled.remaining_tokens == pytest.approx(70.0, abs=0.1)
            assert float(client.hget(bucket, "tt")) == pytest.approx(70.0, abs=0.1)
            assert float(client.hget(bucket, "rt")) == pytest.approx(2.0, abs=0.01)
            assert client.zcard(inflight) == 1 and float(client.get(hold_key)) == 30.0
            assert lease_ms - 1000 < client.pttl(hold_key) <= lease_ms
            again = await store.settle(settled.hold, 50.0)  # never takes more
            assert again.hold.charged_tokens == 30.0
            assert float(client.hget(bucket, "tt")) == pytest.approx(70.0, abs=0.1)
            await store.release(settled.hold, refund_request=False, refund_tokens=30.0)
            late = await store.settle(check.hold, 0.0)  # the hold is gone: nothing back
            assert late.hold is check.hold and late.remaining_tokens is None
            assert float(client.hget(bucket, "tt")) == pytest.approx(100.0, abs=0.1)
        finally:
            await store.aclose()

    asyncio.run(run())


def test_a_token_refund_does_not_expire_a_request_bucket_that_is_not_full(
    redis: RedisProcess,
) -> None:
    """The bucket key expires once every bucket in it would be full again: a refund of
    tokens alone (a release or a settlement) must not shorten that to the token bucket's
    time, which would hand the tenant a full request bucket early."""
    limits = QuotaLimits(requests_per_s=0.1, request_burst=2.0, tokens_per_s=100.0,
                         token_capacity=100.0)

    async def run() -> None:
        store = RedisQuotaStore(redis.url, key_prefix="expiry")
        try:
            bucket, _ = store.keys("t")
            client = redis.client()
            check = await store.reserve("t", limits, 50.0, "m1", 60.0)
            assert check.ok and check.hold is not None
            settled = await store.settle(check.hold, 10.0)
            assert client.pttl(bucket) > 9_000  # the request bucket: 1 / 0.1 s to refill
            await store.release(settled.hold, refund_request=False, refund_tokens=10.0)
            assert client.pttl(bucket) > 9_000
        finally:
            await store.aclose()

    asyncio.run(run())


def test_concurrency_slots_are_leased(redis: RedisProcess) -> None:
    limits = QuotaLimits(max_concurrent=1)

    async def run() -> None:
        store = RedisQuotaStore(redis.url, key_prefix="lease")
        try:
            first = await store.reserve("t", limits, 1.0, "dead-replica:1", 0.3)
            assert first.ok and first.in_flight == 1
            refused = await store.reserve("t", limits, 1.0, "r:2", 60.0)
            assert not refused.ok and refused.limit == "concurrent"
            await asyncio.sleep(0.4)  # the holder never released: its lease ran out
            second = await store.reserve("t", limits, 1.0, "r:3", 60.0)
            assert second.ok
            assert second.hold is not None
            await store.release(second.hold, refund_request=False, refund_tokens=0.0)
            _, inflight = store.keys("t")
            assert redis.client().zcard(inflight) == 0
        finally:
            await store.aclose()

    asyncio.run(run())


def test_unreachable_redis_raises_quickly() -> None:
    async def run() -> None:
        store = RedisQuotaStore(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2)
        t0 = time.monotonic()
        with pytest.raises(QuotaBackendError):
            await store.reserve("t", LIMITS, 1.0, "m", 1.0)
        assert time.monotonic() - t0 < 1.0
        await store.aclose()

    asyncio.run(run())


@pytest.mark.skipif(redis_binary() is None, reason="redis-server is not installed")
def test_failover_logs_once_serves_locally_and_reconnects(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Redis gone: local buckets at 1/replicas, one warning however many calls; Redis back
    on that port: the store returns to it by itself. Redis stalled (CLIENT PAUSE, data
    kept): a release owed while it stalled is replayed once it answers."""
    binary = redis_binary()
    assert binary is not None
    proc = RedisProcess(binary)
    limits = QuotaLimits(requests_per_s=0.01, request_burst=4.0, max_concurrent=4)

    async def wait_shared(store: FailoverQuotaStore) -> None:
        for _ in range(100):
            if not store.in_fallback:
                return
            await asyncio.sleep(0.05)
        raise AssertionError("the store did not return to Redis")

    async def run() -> None:
        store = FailoverQuotaStore(
            RedisQuotaStore(proc.url, key_prefix="fo", timeout_s=0.2),
            MemoryQuotaStore(clamp_to_capacity=True), share=0.5, reconnect_interval_s=0.1)
        try:
            proc.start()
            shared = await store.reserve("t", limits, 1.0, "m-shared", 60.0)
            assert shared.ok and shared.shared and not store.in_fallback
            proc.stop()
            local = [await store.reserve("t", limits, 1.0, f"m{i}", 60.0) for i in range(4)]
            assert store.in_fallback
            # Half of burst 4 locally: two admitted, then refusals from the local bucket.
            assert [c.ok for c in local] == [True, True, False, False]
            assert not any(c.shared for c in local)
            assert local[2].limits == limits.scaled(0.5)
            for check in local[:2]:  # local reservations settle locally
                assert check.hold is not None
                await store.release(check.hold, refund_request=True, refund_tokens=0.0)
            proc.start()
            await wait_shared(store)
            assert store.outages == 1

            held = await store.reserve("t", limits, 1.0, "m-held", 60.0)
            assert held.ok and held.shared and held.hold is not None
            bucket, inflight = store.shared.keys("t")
            client = proc.client()
            assert client.zcard(inflight) == 1
            level = float(client.hget(bucket, "rt"))
            client.execute_command("CLIENT", "PAUSE", "800", "ALL")
            stalled = await store.reserve("t", limits, 1.0, "m-stalled", 60.0)
            assert store.in_fallback and stalled.ok and not stalled.shared
            await store.release(held.hold, refund_request=True, refund_tokens=0.0)
            await wait_shared(store)
            assert client.zcard(inflight) == 0  # the owed release was replayed
            assert float(client.hget(bucket, "rt")) == pytest.approx(level + 1, abs=0.05)
            assert store.outages == 2
        finally:
            await store.aclose()
            proc.stop()

    with caplog.at_level(logging.WARNING, logger="sluice.quota"):
        asyncio.run(run())
    down = [r for r in caplog.records if "unreachable" in r.getMessage()]
    up = [r for r in caplog.records if "reachable again" in r.getMessage()]
    assert len(down) == 2 and len(up) == 2  # once per outage, however many calls


BUSY_LUA = """
local t = redis.call('TIME')
local start = tonumber(t[1]) * 1000000 + tonumber(t[2])
while true do
  local n = redis.call('TIME')
  if tonumber(n[1]) * 1000000 + tonumber(n[2]) - start > tonumber(ARGV[1]) then return 1 end
end
"""


def _stall(proc: RedisProcess, seconds: float) -> threading.Thread:
    """Keep Redis busy in one script for ``seconds`` (a slow Redis: the commands sent
    meanwhile run after it, their senders long timed out)."""
    client = proc.client()
    thread = threading.Thread(target=client.eval, args=(BUSY_LUA, 0, int(seconds * 1e6)),
                              daemon=True)
    thread.start()
    time.sleep(0.05)  # the script has started
    return thread


def test_a_reservation_whose_reply_was_lost_is_released_once(redis: RedisProcess) -> None:
    """A slow Redis runs a reservation after its caller timed out: the slot and the charge
    are there although the caller never heard of them. Releasing it by its member frees
    both; releasing again refunds nothing more."""
    limits = QuotaLimits(requests_per_s=0.01, request_burst=5.0, tokens_per_s=1.0,
                         token_capacity=100.0, max_concurrent=3)

    async def run() -> None:
        store = RedisQuotaStore(redis.url, key_prefix="slow", timeout_s=0.1)
        try:
            first = await store.reserve("t", limits, 10.0, "m-first", 60.0)
            assert first.ok
            bucket, inflight = store.keys("t")
            client = redis.client()
            before = client.hmget(bucket, "rt", "tt")
            busy = _stall(redis, 0.6)
            with pytest.raises(QuotaBackendError):
                await store.reserve("t", limits, 20.0, "m-lost", 60.0)
            busy.join(5)
            assert client.zcard(inflight) == 2  # it ran after all: slot and charge taken
            assert client.exists(store.hold_key("t", "m-lost"))
            lost = Hold("t", limits, "m-lost", 20.0, shared=True)
            for _ in range(2):  # a cancel replayed twice refunds once
                await store.release(lost, refund_request=True, refund_tokens=20.0)
                assert client.zcard(inflight) == 1
                rt, tt = (float(v) for v in client.hmget(bucket, "rt", "tt"))
                assert rt == pytest.approx(float(before[0]), abs=0.05)
                assert tt == pytest.approx(float(before[1]), abs=1.5)
            # a release never refunds more than its reservation charged
            assert first.hold is not None
            await store.release(first.hold, refund_request=False, refund_tokens=1e6)
            assert float(client.hget(bucket, "tt")) <= 100.0
            assert client.zcard(inflight) == 0 and not client.keys("slow:*:hold:*")
        finally:
            await store.aclose()

    asyncio.run(run())


def test_failover_cancels_a_reservation_a_slow_redis_ran_late(redis: RedisProcess) -> None:
    """The reservation times out, the request is served from the local bucket, and once
    Redis answers the late reservation is cancelled there: not charged twice, no slot held
    for the lease."""
    limits = QuotaLimits(requests_per_s=0.01, request_burst=5.0, max_concurrent=2)

    async def run() -> None:
        store = FailoverQuotaStore(
            RedisQuotaStore(redis.url, key_prefix="late", timeout_s=0.1),
            MemoryQuotaStore(clamp_to_capacity=True), share=1.0, reconnect_interval_s=0.1)
        try:
            warm = await store.reserve("t", limits, 1.0, "m-warm", 60.0)
            assert warm.ok and warm.shared and warm.hold is not None
            await store.release(warm.hold, refund_request=True, refund_tokens=0.0)
            bucket, inflight = store.shared.keys("t")
            client = redis.client()
            level = float(client.hget(bucket, "rt"))
            busy = _stall(redis, 0.6)
            served = await store.reserve("t", limits, 1.0, "m-late", 60.0)
            assert served.ok and not served.shared and store.in_fallback
            busy.join(5)
            for _ in range(100):
                if not store.in_fallback:
                    break
                await asyncio.sleep(0.05)
            assert not store.in_fallback
            assert client.zcard(inflight) == 0  # no slot held for the 60 s lease
            assert float(client.hget(bucket, "rt")) == pytest.approx(level, abs=0.05)
            assert store.cancelled_reservations == 1
        finally:
            await store.aclose()

    asyncio.run(run())


@pytest.mark.parametrize("refusal", ["readonly", "oom"])
def test_a_redis_that_answers_ping_but_refuses_scripts_is_down_without_flapping(
    redis: RedisProcess, refusal: str, caplog: pytest.LogCaptureFixture,
) -> None:
    """READONLY (a replica) or OOM (maxmemory): PING still answers, every reservation
    script is refused. The store falls back once, logs once, keeps probing with a script
    (backing off) instead of flapping back on PING, and returns when Redis accepts writes."""
    limits = QuotaLimits(requests_per_s=100.0, request_burst=100.0)
    client = redis.client()

    def refuse() -> None:
        if refusal == "readonly":
            client.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
        else:
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("maxmemory", "1")

    def accept() -> None:
        if refusal == "readonly":
            client.execute_command("REPLICAOF", "NO", "ONE")
        else:
            client.config_set("maxmemory", "0")

    async def run() -> None:
        store = FailoverQuotaStore(
            RedisQuotaStore(redis.url, key_prefix="ro", timeout_s=0.2),
            MemoryQuotaStore(clamp_to_capacity=True), share=0.5, reconnect_interval_s=0.02)
        try:
            assert (await store.reserve("t", limits, 1.0, "m0", 60.0)).shared
            refuse()
            try:
                assert client.ping()
                for i in range(30):
                    check = await store.reserve("t", limits, 1.0, f"m{i + 1}", 60.0)
                    assert check.ok and not check.shared
                    await asyncio.sleep(0.02)
                assert store.in_fallback and store.outages == 1  # no flapping on PING
                probes = store.backend_errors
                await asyncio.sleep(0.5)
                # backing off: 0.02, 0.04, ... s, so a handful of probes in 0.5 s, not 25
                assert store.backend_errors - probes <= 6
            finally:
                accept()
            for _ in range(200):
                if not store.in_fallback:
                    break
                await asyncio.sleep(0.05)
            assert not store.in_fallback
            assert (await store.reserve("t", limits, 1.0, "m-back", 60.0)).shared
        finally:
            await store.aclose()

    with caplog.at_level(logging.WARNING, logger="sluice.quota"):
        asyncio.run(run())
    down = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(down) == 1
