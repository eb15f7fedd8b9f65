"""One local Ray instance and Serve proxy for all the cluster tests (Ray starts slowly on two
cores: about half a minute), and a redis-server for the quota test.

Serve's metric push intervals are shortened (environment variables, read by every Ray
process this Ray starts) so autoscaling reacts within a second or two. Without Ray the
tests skip, unless ``SLUICE_REQUIRE_RAY=1`` (``scripts/test.sh`` sets it), when they fail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.cluster.raylocal import require_ray
from tests.tenants.redisproc import RedisProcess, free_port, redis_binary

RAY_ENV = {
    "RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.25",
    "RAY_SERVE_HANDLE_AUTOSCALING_METRIC_PUSH_INTERVAL_S": "0.25",
    "RAY_DEDUP_LOGS": "0",
    # Two cores shared by a proxy, a front end, replicas and the tests: a replica may take
    # longer than Serve's default 0.1 s to answer a queue-length probe, and one that does
    # not answer in time is passed over.
    "RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S": "1.0",
    "RAY_SERVE_MAX_QUEUE_LENGTH_RESPONSE_DEADLINE_S": "2.0",
}


@dataclass
class LocalRay:
    """The session's Ray and Serve proxy."""

    url: str


@pytest.fixture(scope="session")
def local_ray() -> Iterator[LocalRay]:
    ray = require_ray()
    from ray import serve

    saved = {k: os.environ.get(k) for k in RAY_ENV}
    os.environ.update(RAY_ENV)
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield LocalRay(f"http://127.0.0.1:{port}")
    finally:
        serve.shutdown()
        ray.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def cluster_redis() -> Iterator[RedisProcess]:
    binary = redis_binary()
    if binary is None:
        if os.environ.get("SLUICE_REQUIRE_REDIS") == "1":
            pytest.fail("redis-server is not on PATH (scripts/test.sh installs it)")
        pytest.skip("redis-server is not installed")
    proc = RedisProcess(binary)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


