"""Helpers for the server tests: a real uvicorn server on an ephemeral port around
``create_app(config)``, config builders, polling, and assertions on the error shape and
on ``/metrics``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from sluice.backends.base import Backend
from sluice.config import Config, load_config, with_overrides
from sluice.server.app import create_app
from sluice.server.connections import uvicorn_settings

ROOT = Path(__file__).resolve().parents[2]
SYNTHETIC_TOML = ROOT / "examples" / "synthetic.toml"
START_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 30.0

ERROR_KEYS = {"message", "type", "param", "code"}
CONTEXT_FIELDS = {"n_prompt_tokens", "n_ctx"}
"""llama-server's members of a ``context_length_exceeded`` error, beside OpenAI's."""


def error_keys(err: dict[str, Any]) -> set[str]:
    """The members of ``err`` that make its shape: all of them, less
    llama-server's counts on a context-length refusal (which must then be whole numbers)."""
    keys = set(err)
    if keys >= CONTEXT_FIELDS:
        assert isinstance(err["n_prompt_tokens"], int) and err["n_prompt_tokens"] > 0, err
        assert isinstance(err["n_ctx"], int) and err["n_ctx"] > 0, err
        keys -= CONTEXT_FIELDS
    return keys


@dataclass
class LiveServer:
    """A running server: its base URL and the config it was started with."""

    url: str
    config: Config
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def runtime(self) -> Any:
        return self.server.config.app.state.ctx.runtime  # type: ignore[union-attr]

    def client(self, **kwargs: Any) -> httpx.Client:
        kwargs.setdefault("timeout", 30.0)
        return httpx.Client(base_url=self.url, **kwargs)

    def async_client(self, **kwargs: Any) -> httpx.AsyncClient:
        kwargs.setdefault("timeout", 30.0)
        return httpx.AsyncClient(base_url=self.url, **kwargs)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(STOP_TIMEOUT_S)
        assert not self.thread.is_alive(), "uvicorn did not stop"


def start_server(config: Config, backends: Mapping[str, Backend] | None = None) -> LiveServer:
    """Start uvicorn on 127.0.0.1 with an ephemeral port; return once it serves."""
    app = create_app(config, backends)
    uv_config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                               lifespan="on", timeout_graceful_shutdown=5,
                               **uvicorn_settings(config.server))
    server = uvicorn.Server(uv_config)
    # Signal handlers can only be installed from the main thread.
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("uvicorn exited before it started")
        if time.monotonic() > deadline:
            server.should_exit = True
            thread.join(STOP_TIMEOUT_S)
            raise RuntimeError("uvicorn did not start in time")
        time.sleep(0.01)
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    return LiveServer(url=f"http://{host}:{port}", config=config, server=server, thread=thread)


def synthetic_config(overrides: dict[str, dict[str, Any]] | None = None) -> Config:
    """``examples/synthetic.toml``, with ``{section: {field: value}}`` applied."""
    config = load_config(SYNTHETIC_TOML)
    return with_overrides(config, overrides) if overrides else config


def config_with(
    *,
    models: list[dict[str, Any]] | None = None,
    **sections: Any,
) -> Config:
    """``examples/synthetic.toml`` as a dict, with whole sections or model lists
    replaced (``tenants=[...]``, ``server={...}`` merges into the section)."""
    data = load_config(SYNTHETIC_TOML).model_dump()
    if models is not None:
        data["models"] = models
        data["server"]["default_model"] = None  # the first model, unless ``server`` says
    for name, value in sections.items():
        if isinstance(value, dict):
            data[name] = {**data.get(name, {}), **value}
        else:
            data[name] = value
    return Config.model_validate(data)


def synth_chat(model_id: str = "synth-chat", **options: Any) -> dict[str, Any]:
    """A generative synthetic model entry (the example's costs unless overridden)."""
    opts: dict[str, Any] = {
        "load_s": 0.01, "n_seq_max": 8, "n_ctx_per_seq": 512, "step_fixed_s": 0.003,
        "decode_per_seq_s": 0.0005, "prefill_per_token_s": 0.00005,
    }
    opts.update(options)
    return {"id": model_id, "kind": "generative", "backend": "synthetic",
            "task": "generation", "memory_bytes": 100_000_000, "load_cost_s": 0.1,
            "options": opts}


def synth_embed(model_id: str = "synth-a", **options: Any) -> dict[str, Any]:
    """A one-shot embedding synthetic model entry."""
    opts: dict[str, Any] = {"dim": 16, "load_s": 0.01, "batch_fixed_s": 0.002,
                            "per_item_s": 0.0005}
    opts.update(options)
    return {"id": model_id, "kind": "oneshot", "backend": "synthetic", "task": "embedding",
            "memory_bytes": 100_000_000, "load_cost_s": 0.1, "options": opts}


def synth_rerank(model_id: str = "synth-rerank", **options: Any) -> dict[str, Any]:
    """A one-shot rerank synthetic model entry (scores by word overlap)."""
    opts: dict[str, Any] = {"load_s": 0.01, "batch_fixed_s": 0.002, "per_item_s": 0.0005}
    opts.update(options)
    return {"id": model_id, "kind": "oneshot", "backend": "synthetic", "task": "rerank",
            "memory_bytes": 100_000_000, "load_cost_s": 0.1, "options": opts}


def wait_for(predicate: Callable[[], Any], timeout_s: float = 5.0, every_s: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"condition not met within {timeout_s} s (last value: {last!r})")


def assert_error(response: httpx.Response, status: int, *, code: str | None = None,
                 type: str | None = None, param: str | None = None) -> dict[str, Any]:
    """The response is ``status`` with exactly the OpenAI error shape; returns the error."""
    assert response.status_code == status, response.text
    assert response.headers.get("x-request-id"), "every response carries x-request-id"
    body = response.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert error_keys(err) == ERROR_KEYS, err
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str) and err["type"]
    if code is not None:
        assert err["code"] == code, err
    if type is not None:
        assert err["type"] == type, err
    if param is not None:
        assert err["param"] == param, err
    return err


def sse_data(lines: Iterable[str]) -> list[Any]:
    """The ``data:`` payloads of an SSE stream: parsed JSON, or the raw string
    (``[DONE]``)."""
    out: list[Any] = []
    for line in lines:
        if not line.startswith("data:"):
            assert line == "", f"unexpected SSE line {line!r}"
            continue
        data = line[len("data:"):].strip()
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def scrape(client: httpx.Client) -> dict[str, list[tuple[dict[str, str], float]]]:
    """``/metrics`` parsed by prometheus_client: sample name → [(labels, value)]."""
    r = client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def metric_sum(samples: dict[str, list[tuple[dict[str, str], float]]], name: str,
               **labels: str) -> float:
    """The sum of ``name`` over every label set that includes ``labels``."""
    return sum(value for have, value in samples.get(name, [])
               if all(have.get(k) == v for k, v in labels.items()))
