"""The holes a security review found (issue 11, part 5), each closed and shown over HTTP
where a user meets it: admin routes closed without an admin key, bounded per-tenant state on
an open server, prompts measured before they are tokenized (and never on the event loop),
embeddings admitted as one unit, priority ceilings, a metrics key, sanitized 500 bodies and
bounded stop strings on ``/v1/infer``."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from sluice.backends.base import ModelSpec
from sluice.backends.synthetic import SyntheticBackend, SyntheticTokenizer
from sluice.config import ServerConfig, TenantConfig, hash_key
from sluice.policy.queues.wfq import IDLE_SLACK
from sluice.server.auth import Auth
from sluice.server.errors import MAX_DETAIL_CHARS, public_text
from sluice.server.metrics import OTHER_TENANT
from sluice.server.schemas.base import MAX_STOP, MAX_STOP_CHARS
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

CHAT = "synth-chat"


@pytest.fixture(scope="module")
def live(serve_module: Callable[..., LiveServer]) -> LiveServer:
    return serve_module(config_with(models=[synth_chat(), synth_embed()],
                                    workers={"count": 1}))


@pytest.mark.parametrize("stop", [
    ["x" * (MAX_STOP_CHARS + 1)], [""], ["a"] * (MAX_STOP + 1),
])
def test_infer_stop_strings_have_chats_bounds(live: LiveServer, stop: list[str]) -> None:
    with live.client() as c:
        for path, body in (("/v1/infer", {"model": CHAT, "input": "hi", "stop": stop}),
                           ("/v1/chat/completions", {
                               "model": CHAT, "stop": stop,
                               "messages": [{"role": "user", "content": "hi"}]})):
            assert_error(c.post(path, json=body), 400, code="invalid_value", param="stop")
        ok = c.post("/v1/infer", json={"model": CHAT, "input": "hi", "max_new_tokens": 2,
                                       "stop": ["x" * MAX_STOP_CHARS] * MAX_STOP})
        assert ok.status_code == 200, ok.text


# -- priority: a tenant may lower its priority, never raise it past its ceiling ------------


def _served_priority(c: httpx.Client, body: dict[str, Any] | None = None,
                     headers: dict[str, str] | None = None) -> int:
    r = c.post("/v1/infer", json={"model": CHAT, "input": "hi", "max_new_tokens": 1,
                                  **(body or {})}, headers=headers or {})
    assert r.status_code == 200, r.text
    return int(r.headers["x-sluice-priority"])


def test_a_tenant_cannot_raise_its_priority_past_its_ceiling(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve(config_with(
        models=[synth_chat()], workers={"count": 1},
        tenants=[{"id": "plain", "api_keys": ["sk-plain"], "priority": 5},
                 {"id": "vip", "api_keys": ["sk-vip"], "priority": 4, "priority_ceiling": 1}]))
    with live.client(headers={"authorization": "Bearer sk-plain"}) as c:
        assert _served_priority(c) == 5
        assert _served_priority(c, {"priority": 0}) == 5  # the body cannot raise it
        assert _served_priority(c, headers={"x-sluice-priority": "0"}) == 5  # nor a header
        assert _served_priority(c, {"priority": 8}) == 8  # lowering is fine
        assert _served_priority(c, headers={"x-sluice-priority": "9"}) == 9
    with live.client(headers={"authorization": "Bearer sk-vip"}) as c:
        assert _served_priority(c) == 4
        assert _served_priority(c, {"priority": 0}) == 1
        assert _served_priority(c, {"priority": 2}) == 2
        assert _served_priority(c, headers={"x-sluice-priority": "0"}) == 1


def test_unconfigured_tenants_get_the_default_tenants_ceiling(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve(config_with(models=[synth_chat()], workers={"count": 1},
                             tenants=[{"id": "default", "priority": 6},
                                      {"id": "ops", "priority": 3, "priority_ceiling": 0}]))
    with live.client() as c:
        assert _served_priority(c, {"priority": 0}) == 6
        assert _served_priority(c, {"priority": 0}, {"x-tenant-id": "stranger"}) == 6
        assert _served_priority(c, {"priority": 0, "tenant_id": "stranger"}) == 6
        assert _served_priority(c, {"priority": 0}, {"x-tenant-id": "ops"}) == 0
        assert _served_priority(c, {"priority": 0, "tenant_id": "ops"}) == 0


def test_a_ceiling_below_the_default_priority_is_refused() -> None:
    with pytest.raises(ValueError, match="priority_ceiling"):
        TenantConfig(id="x", priority=2, priority_ceiling=3)


# -- admin routes: disabled without an admin key, unless opened for development ------------


def _admin_load(c: httpx.Client, headers: dict[str, str] | None = None) -> httpx.Response:
    return c.post("/admin/models/synth-a/load", headers=headers or {})


@pytest.mark.parametrize("tenants", [[], [{"id": "acme", "api_keys": ["sk-acme"]}]])
def test_admin_routes_are_disabled_without_an_admin_key(
    serve: Callable[..., LiveServer], tenants: list[dict[str, Any]],
) -> None:
    live = serve(config_with(models=[synth_chat(), synth_embed()], workers={"count": 1},
                             tenants=tenants))
    with live.client() as c:
        for headers in ({}, {"x-admin-key": "anything"}, {"authorization": "Bearer sk-acme"}):
            err = assert_error(_admin_load(c, headers), 403, code="admin_disabled",
                               type="permission_error")
            assert "SLUICE_ADMIN_KEY" in err["message"] and "open_admin" in err["message"]
        assert_error(c.post("/admin/models/synth-a/unload"), 403, code="admin_disabled")
        models = {m["id"]: m["resident"] for m in c.get(
            "/v1/models", headers={"authorization": "Bearer sk-acme"}).json()["data"]}
        assert models["synth-a"] is False  # nothing was loaded


def test_admin_routes_open_only_when_asked_to(serve: Callable[..., LiveServer]) -> None:
    live = serve(config_with(models=[synth_chat(), synth_embed()], workers={"count": 1},
                             server={"open_admin": True}))
    with live.client() as c:
        assert _admin_load(c).status_code == 200


def test_the_admin_key_can_come_from_a_file(serve: Callable[..., LiveServer],
                                            tmp_path: Path) -> None:
    key_file = tmp_path / "admin-key"
    key_file.write_text("# the admin key\n\n  adm-from-a-file  \n")
    live = serve(config_with(models=[synth_chat(), synth_embed()], workers={"count": 1},
                             server={"admin_key_file": str(key_file), "open_admin": True}))
    with live.client() as c:
        # open_admin does not open routes that have a key
        assert_error(_admin_load(c), 401, code="invalid_admin_key")
        assert_error(_admin_load(c, {"x-admin-key": "# the admin key"}), 401)
        assert _admin_load(c, {"x-admin-key": "adm-from-a-file"}).status_code == 200


def test_an_unreadable_or_empty_admin_key_file_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"server\.admin_key_file"):
        ServerConfig(admin_key_file=str(tmp_path / "missing")).admin_key_value()
    empty = tmp_path / "empty"
    empty.write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no key"):
        ServerConfig(admin_key_file=str(empty)).admin_key_value()


def test_the_cli_takes_the_admin_key_from_env_or_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sluice.cli import main
    from sluice.cli.common import config_from_args

    seen: list[Any] = []
    monkeypatch.setattr("sluice.cli.models.cmd_models",
                        lambda args: seen.append(config_from_args(args)) or 0)
    for name in ("SLUICE_ADMIN_KEY", "SLUICE_ADMIN_KEY_FILE", "SLUICE_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    key_file = tmp_path / "k"
    key_file.write_text("adm-file\n")
    assert main(["models", "--admin-key-file", str(key_file)]) == 0
    assert seen[-1].server.admin_key_value() == "adm-file"
    monkeypatch.setenv("SLUICE_ADMIN_KEY_FILE", str(key_file))
    assert main(["models"]) == 0
    assert seen[-1].server.admin_key_value() == "adm-file"
    monkeypatch.setenv("SLUICE_ADMIN_KEY", "adm-env")
    assert main(["models"]) == 0
    assert seen[-1].server.admin_key_value() == "adm-env"
    monkeypatch.delenv("SLUICE_ADMIN_KEY")
    monkeypatch.delenv("SLUICE_ADMIN_KEY_FILE")
    assert main(["models", "--open-admin"]) == 0
    assert seen[-1].server.admin_key_value() is None and seen[-1].server.open_admin


# -- /metrics and /status.json: an optional metrics key --------------------------------------


METRICS_KEY = "mk-scrape-only"


def test_metrics_and_status_json_need_the_metrics_key_when_set(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve(config_with(models=[synth_chat()], workers={"count": 1},
                             tenants=[{"id": "acme", "api_keys": ["sk-acme"]}],
                             server={"metrics_key": METRICS_KEY}))
    with live.client() as c:
        for path in ("/metrics", "/status.json"):
            for headers in ({}, {"authorization": "Bearer sk-acme"},
                            {"x-metrics-key": "wrong"}):
                assert_error(c.get(path, headers=headers), 401, code="invalid_metrics_key")
            assert c.get(path, headers={"authorization": f"Bearer {METRICS_KEY}"}
                         ).status_code == 200
            assert c.get(path, headers={"x-metrics-key": METRICS_KEY}).status_code == 200
        # probes and the (data-free) page stay open; the page sends the key from its fragment
        assert c.get("/health").status_code == 200 and c.get("/ready").status_code == 200
        page = c.get("/status")
        assert page.status_code == 200 and "X-Metrics-Key" in page.text
        # the metrics key is not an API key
        r = c.post("/v1/infer", json={"model": CHAT, "input": "hi", "max_new_tokens": 1},
                   headers={"authorization": f"Bearer {METRICS_KEY}"})
        assert_error(r, 401, code="invalid_api_key")


def test_metrics_stay_open_without_a_metrics_key(live: LiveServer) -> None:
    with live.client() as c:
        assert c.get("/metrics").status_code == 200
        assert c.get("/status.json").status_code == 200


def test_the_metrics_key_is_held_as_a_digest() -> None:
    auth = Auth([], None, metrics_key=METRICS_KEY)
    assert METRICS_KEY not in repr(vars(auth))
    assert hash_key(METRICS_KEY).encode() in vars(auth).values()


# -- error bodies: no internal paths or exception text with file paths ------------------------


SECRET_DIR = "/srv/sluice-models/private"


class _LeakyBackend(SyntheticBackend):
    """Synthetic models whose failures carry file paths: ``leaky-load`` cannot load (an
    OSError naming a file), ``leaky-step`` fails each request while detokenizing."""

    def load(self, spec: ModelSpec) -> Any:
        if spec.model_id == "leaky-load":
            raise OSError(2, "No such file or directory", f"{SECRET_DIR}/weights.gguf")
        model = super().load(spec)
        if spec.model_id == "leaky-step":
            def token_bytes(token: int) -> bytes:
                raise OSError(13, "Permission denied", f"{SECRET_DIR}/vocab.bin")
            model.token_bytes = token_bytes  # type: ignore[union-attr]
        return model


def test_error_bodies_carry_no_internal_paths(serve: Callable[..., LiveServer],
                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    live = serve(config_with(
        models=[synth_chat(), synth_chat("leaky-step"), synth_chat("leaky-load")],
        workers={"count": 1}, server={"open_admin": True, "default_model": CHAT}),
        backends={"synthetic": _LeakyBackend()})
    with live.client() as c:
        r = c.post("/v1/infer", json={"model": "leaky-step", "input": "hi",
                                      "max_new_tokens": 2})
        err = assert_error(r, 500, code="internal_error")
        assert "<path>" in err["message"], err  # the reason stays, the path goes
        streamed = c.post("/v1/completions", json={"model": "leaky-step", "prompt": "hi",
                                                    "max_tokens": 2, "stream": True})
        assert streamed.status_code in (200, 500)
        load = c.post("/v1/infer", json={"model": "leaky-load", "input": "hi"})
        assert_error(load, 503, code="model_load_failed")
        admin = c.post("/admin/models/leaky-load/load")
        err = assert_error(admin, 409, code="load_failed")
        for body in (r.text, streamed.text, load.text, admin.text):
            assert SECRET_DIR not in body and "sluice-models" not in body, body
        # the server still serves, and the detail is in the log
        ok = c.post("/v1/infer", json={"model": CHAT, "input": "hi", "max_new_tokens": 2})
        assert ok.status_code == 200
    assert SECRET_DIR in caplog.text


def test_public_text_strips_paths_and_bounds_length() -> None:
    assert public_text("open '/home/u/.cache/m.gguf' failed") == "open '<path>' failed"
    assert public_text('File "/usr/lib/x.py", line 3') == 'File "<path>", line 3'
    assert public_text("C:\\Users\\me\\m.gguf gone") == "<path> gone"
    assert public_text("60 tokens/min, 3/4 done") == "60 tokens/min, 3/4 done"
    assert len(public_text("x" * 10_000)) == MAX_DETAIL_CHARS


# -- tokenizing: never on the event loop; a prompt that cannot fit is refused by its length --


class _SpyTokenizer(SyntheticTokenizer):
    """Records the thread of every ``tokenize`` call and the lengths it was given."""

    calls: list[tuple[str, int]] = []

    def tokenize(self, text: str, *, add_bos: bool, special: bool = True) -> list[int]:
        self.calls.append((threading.current_thread().name, len(text)))
        return super().tokenize(text, add_bos=add_bos, special=special)


class _SpyBackend(SyntheticBackend):
    def load_tokenizer(self, spec: ModelSpec) -> SyntheticTokenizer:
        return _SpyTokenizer(spec)


def test_prompts_are_measured_before_and_tokenized_off_the_event_loop(
    serve: Callable[..., LiveServer],
) -> None:
    _SpyTokenizer.calls.clear()
    # One token per byte: a prompt of 512 bytes or more cannot fit 512 tokens per sequence.
    live = serve(config_with(models=[synth_chat(byte_tokens=True, n_ctx_per_seq=512)],
                             workers={"count": 1}), backends={"synthetic": _SpyBackend()})
    huge = "x" * 600_000
    with live.client() as c:
        for path, body, param in (
            ("/v1/completions", {"prompt": huge}, "prompt"),
            ("/v1/infer", {"input": huge}, "input"),
            ("/v1/infer", {"input": [{"role": "user", "content": huge}]}, "input"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": huge}]},
             "messages"),
        ):
            r = c.post(path, json={"model": CHAT, **body})
            err = assert_error(r, 400, code="context_length_exceeded", param=param)
            assert "bytes) has at least" in err["message"], err
        # /tokenize counts past one sequence, but not past the model's whole context
        for field, value in (("content", huge), ("prompt", huge),
                             ("messages", [{"role": "user", "content": huge}])):
            r = c.post("/tokenize", json={"model": CHAT, field: value})
            err = assert_error(r, 400, code="context_length_exceeded", param=field)
            assert "4096 tokens in all" in err["message"], err
        assert not [n for _, n in _SpyTokenizer.calls if n >= 600_000], "tokenized a huge one"
        counted = c.post("/tokenize", json={"model": CHAT, "prompt": "y" * 3000})
        assert counted.status_code == 200 and counted.json()["count"] == 3001
        for path, body in (("/v1/completions", {"prompt": "hi there"}),
                           ("/v1/infer", {"input": "hi there"}),
                           ("/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "hi"}]})):
            r = c.post(path, json={"model": CHAT, "max_tokens": 2, "max_new_tokens": 2,
                                   **body})
            assert r.status_code == 200, r.text
    threads = {name for name, _ in _SpyTokenizer.calls}
    assert threads and live.thread.name not in threads, threads  # never the event loop's


# -- the deadline heap: bounded by the live requests ----------------------------------------


def test_the_deadline_heap_tracks_the_live_requests(serve: Callable[..., LiveServer]) -> None:
    from sluice.engine.runtime import DEADLINE_SLACK

    live = serve(config_with(models=[synth_chat()], workers={"count": 1}))
    runtime = live.runtime
    day_ms = 86_400_000  # the longest deadline a request may carry
    with live.client() as c:
        for i in range(6 * DEADLINE_SLACK):
            r = c.post("/v1/infer", json={"model": CHAT, "input": "hi", "max_new_tokens": 1,
                                          "deadline_ms": day_ms})
            assert r.status_code == 200, r.text
            # every request finished, its deadline a day off: the heap still stays small
            assert runtime.deadline_entries <= 2 * runtime.snapshot().live_requests \
                + DEADLINE_SLACK + 1, i
        with ThreadPoolExecutor(8) as pool:  # and with requests in flight together
            codes = list(pool.map(lambda _: c.post("/v1/infer", json={
                "model": CHAT, "input": "hi", "max_new_tokens": 3,
                "deadline_ms": day_ms}).status_code, range(200)))
        assert codes == [200] * 200
        wait_for(lambda: runtime.snapshot().live_requests == 0)
    assert runtime.deadline_entries <= DEADLINE_SLACK + 1


# -- an open server and any X-Tenant-ID: bounded metric series and WFQ state ---------------


def test_unconfigured_tenants_share_a_label_and_leave_no_wfq_state(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve(config_with(models=[synth_chat()], workers={"count": 1},
                             scheduling={"scheduler": "wfq"},
                             tenants=[{"id": "acme", "weight": 2}]))
    n_strangers = 5 * IDLE_SLACK

    def send(i: int) -> int:
        with live.client() as c:
            return c.post("/v1/infer", json={"model": CHAT, "input": "hi", "max_new_tokens": 2},
                          headers={"x-tenant-id": f"stranger-{i}"}).status_code

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(send, range(n_strangers))) == [200] * n_strangers
    with live.client() as c:
        for tenant in ("acme", "default"):
            r = c.post("/v1/infer", json={"model": CHAT, "input": "hi", "max_new_tokens": 2},
                       headers={"x-tenant-id": tenant})
            assert r.status_code == 200 and r.headers["x-sluice-tenant"] == tenant
        wait_for(lambda: live.runtime.snapshot().live_requests == 0)
        samples = scrape(c)
    labels = {lbl["tenant"] for series in samples.values() for lbl, _ in series
              if "tenant" in lbl}
    assert labels == {"acme", "default", OTHER_TENANT}
    assert metric_sum(samples, "sluice_requests_total", tenant=OTHER_TENANT,
                      state="completed") == n_strangers
    assert metric_sum(samples, "sluice_requests_total", tenant="acme") == 1
    # WFQ keeps counters for the backlogged tenants and a bounded few idle ones.
    assert live.runtime._scheduler.tenants_tracked() <= 2 * IDLE_SLACK + 3


# -- embeddings: one request with many inputs is admitted as one unit -----------------------


def test_an_embeddings_request_with_more_inputs_than_the_queue_is_served(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve(config_with(models=[synth_embed(), synth_chat()], workers={"count": 1,
                                                                            "inbox_capacity": 2},
                             scheduling={"queue_capacity": 4, "scheduler": "wfq"},
                             server={"default_model": "synth-a"}))
    inputs = [f"text number {i}" for i in range(40)]
    with live.client() as c:
        r = c.post("/v1/embeddings", json={"model": "synth-a", "input": inputs},
                   headers={"x-tenant-id": "bulk"})
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        assert [d["index"] for d in data] == list(range(40))
        one = c.post("/v1/embeddings", json={"model": "synth-a", "input": inputs[7]}).json()
        assert data[7]["embedding"] == one["data"][0]["embedding"]
        wait_for(lambda: live.runtime.snapshot().live_requests == 0)
        samples = scrape(c)
    # its cost is its inputs: 40 scheduling items of cost 1, each counted as a request
    assert live.runtime._scheduler.counter("bulk") == 40
    assert metric_sum(samples, "sluice_requests_total", model="synth-a",
                      state="completed") == 41


def test_a_unit_is_refused_whole_while_the_queue_is_full_and_served_after(
    serve: Callable[..., LiveServer],
) -> None:
    live = serve(config_with(
        models=[synth_chat("slow", step_fixed_s=0.05, n_seq_max=1), synth_embed()],
        workers={"count": 1, "inbox_capacity": 1}, scheduling={"queue_capacity": 2},
        server={"default_model": "slow"}))
    inputs = [f"t{i}" for i in range(10)]

    def blocker() -> int:
        with live.client() as c:
            return c.post("/v1/infer", json={"model": "slow", "input": "go",
                                             "max_new_tokens": 20}).status_code

    with ThreadPoolExecutor(4) as pool, live.client() as c:
        # slow requests until the queue is full (one runs, one waits at the worker)
        blocked = []
        while live.runtime.snapshot().queue_depth < 2:
            blocked.append(pool.submit(blocker))
            wait_for(lambda: live.runtime.snapshot().live_requests == len(blocked))
        r = c.post("/v1/embeddings", json={"model": "synth-a", "input": inputs})
        assert_error(r, 503, code="queue_full")
        assert int(r.headers["retry-after"]) >= 1
        assert live.runtime.snapshot().queue_depth == 2  # nothing of the unit was queued
        assert [f.result() for f in blocked] == [200] * len(blocked)
        r = c.post("/v1/embeddings", json={"model": "synth-a", "input": inputs})
        assert r.status_code == 200, r.text
        assert len(r.json()["data"]) == 10
        wait_for(lambda: live.runtime.snapshot().live_requests == 0)
        samples = scrape(c)
    # every input of the refused unit ended rejected, none was left behind
    assert metric_sum(samples, "sluice_requests_total", model="synth-a",
                      state="rejected") == 10
