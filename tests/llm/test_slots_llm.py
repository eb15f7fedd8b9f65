"""A long system prompt survives a restart on the real model (SmolLM2, llama.cpp's
``llama_state_seq_save_file`` / ``_load_file``): saved from the slot a chat left it in,
erased, restored on a new server into another slot, and reused by the same chat there (the
engine's prefix-hit counter rises by the prompt, the greedy answer is the same)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from sluice.config import Config
from tests.server.live import LiveServer, start_server

pytestmark = pytest.mark.llm
pytest.importorskip("llama_cpp", reason="the llm extra is not installed")

SYSTEM = ("You are a careful assistant for a library. Answer in one short sentence, name "
          "the shelf a book is on, never invent titles, and say when you do not know. " * 3)
CHAT = {"model": "chat", "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "system", "content": SYSTEM},
                     {"role": "user", "content": "Where are the atlases?"}]}


def _server(folder: Path) -> LiveServer:
    return start_server(Config.model_validate({
        "models": [{"id": "chat", "kind": "generative", "backend": "llamacpp",
                    "task": "generation", "memory_bytes": 400_000_000,
                    "options": {"path": "packaged:smollm2-135m-instruct", "n_ctx": 2048,
                                "n_seq_max": 2, "n_threads": 2}}],
        "server": {"slot_save_path": str(folder)},
        "workers": {"count": 1, "budget_bytes": 1_000_000_000},
    }))


def _hits(live: LiveServer) -> int:
    [worker] = live.runtime.snapshot().workers
    return sum(m.prefix_hit_tokens for m in worker.models)


def _chat(http: httpx.Client) -> dict[str, Any]:
    r = http.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_a_saved_slot_is_restored_after_a_restart_and_reused(tmp_path: Path) -> None:
    live = _server(tmp_path)
    try:
        with live.client(timeout=120) as http:
            first = _chat(http)
            n_prompt = first["usage"]["prompt_tokens"]
            saved = http.post("/slots/0?action=save", json={"filename": "system.bin"})
            assert saved.status_code == 200, saved.text
            assert saved.json()["n_saved"] == n_prompt + first["usage"]["completion_tokens"] - 1
            assert http.post("/slots/0?action=erase").json()["n_erased"] == saved.json()[
                "n_saved"]
    finally:
        live.stop()
    live = _server(tmp_path)
    try:
        with live.client(timeout=120) as http:
            restored = http.post("/slots/1?action=restore", json={"filename": "system.bin"})
            assert restored.status_code == 200, restored.text
            assert restored.json()["n_restored"] == saved.json()["n_saved"]
            assert restored.json()["n_read"] > 0
            before = _hits(live)
            again = _chat(http)
            assert _hits(live) - before >= n_prompt - 1  # the prompt was not computed again
            assert again["choices"][0]["message"]["content"] == first["choices"][0][
                "message"]["content"]
    finally:
        live.stop()
