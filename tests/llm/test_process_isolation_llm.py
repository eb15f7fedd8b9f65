"""Process isolation on the real model (SmolLM2, llama.cpp): with the worker in a process
of its own (``workers.isolation = "process"``) the greedy answers, token counts and the
admin paths that cross to the worker (saving a slot runs a function on its engine,
erasing one an ``AdminCall``) are the same as with the worker a thread of the server."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from sluice.config import Config
from tests.server.live import start_server

pytestmark = pytest.mark.llm
pytest.importorskip("llama_cpp", reason="the llm extra is not installed")

PROMPTS = ("Name three colours of the rainbow.", "What is 2+2? Reply with the number only.")


def _answers(isolation: str, folder: Path) -> dict[str, Any]:
    live = start_server(Config.model_validate({
        "models": [{"id": "chat", "kind": "generative", "backend": "llamacpp",
                    "task": "generation", "memory_bytes": 400_000_000,
                    "options": {"path": "packaged:smollm2-135m-instruct", "n_ctx": 2048,
                                "n_seq_max": 2, "n_threads": 2}}],
        "server": {"slot_save_path": str(folder)},
        "workers": {"count": 1, "budget_bytes": 1_000_000_000, "isolation": isolation},
    }))
    try:
        [worker] = live.runtime.workers
        in_child = getattr(worker, "pid", None)
        assert (in_child is not None and in_child != os.getpid()) == (isolation == "process")
        out: dict[str, Any] = {}
        with live.client(timeout=120) as http:
            for prompt in PROMPTS:
                r = http.post("/v1/chat/completions", json={
                    "model": "chat", "max_tokens": 24, "temperature": 0,
                    "messages": [{"role": "user", "content": prompt}]})
                assert r.status_code == 200, r.text
                body = r.json()
                out[prompt] = (body["choices"][0]["message"]["content"], body["usage"])
            saved = http.post("/slots/0?action=save", json={"filename": f"{isolation}.bin"})
            assert saved.status_code == 200, saved.text
            erased = http.post("/slots/0?action=erase")
            assert erased.status_code == 200, erased.text
            out["slot"] = (saved.json()["n_saved"], erased.json()["n_erased"])
        return out
    finally:
        live.stop()


@pytest.mark.timeout(600)
def test_a_worker_process_answers_as_a_worker_thread(tmp_path: Path) -> None:
    thread = _answers("thread", tmp_path)
    process = _answers("process", tmp_path)
    assert process == thread
    assert all(text for text, _ in (thread[p] for p in PROMPTS))
    n_saved, n_erased = thread["slot"]
    assert n_saved > 0 and n_erased == n_saved
