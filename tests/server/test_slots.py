"""llama-server's ``POST /slots/{id}?action=save|restore`` with ``server.slot_save_path`` on
a real uvicorn server (synthetic model): a retained prefix saved, erased, restored into
another slot and reused by the next request with that prompt (``/completion``'s
``timings.cache_n`` and the engine's prefix-hit counter); a slot in use, another tenant's
slot and every bad input refused in llama-server's error shape, the server serving on after
them; 501 without a slot folder."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.server.live import LiveServer, config_with, synth_chat, wait_for
from tests.server.test_llama_native_api import assert_llama_error

PROMPT = " ".join(f"word{i}" for i in range(40))
"""A prompt long enough to be retained (``engine.min_prefix_tokens``: 16)."""
KEYS = {"acme": "sk-acme-0123456789", "zeta": "sk-zeta-0123456789"}


def _server(serve: Callable[..., LiveServer], folder: Path | None, **options: Any
            ) -> LiveServer:
    return serve(config_with(
        models=[synth_chat("chat", n_seq_max=4, **options)],
        server={"slot_save_path": None if folder is None else str(folder)},
        workers={"count": 1},
        tenants=[{"id": t, "api_keys": [k]} for t, k in KEYS.items()]))


def _auth(tenant: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[tenant]}"}


def _hits(live: LiveServer) -> int:
    """The engine's prefix-hit counter: prompt tokens copied instead of computed."""
    [worker] = live.runtime.snapshot().workers
    return sum(m.prefix_hit_tokens for m in worker.models if m.model_id == "chat")


def _complete(http: httpx.Client, tenant: str = "acme") -> dict[str, Any]:
    r = http.post("/v1/completions", headers=_auth(tenant),
                  json={"model": "chat", "prompt": PROMPT, "max_tokens": 4})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _native(http: httpx.Client) -> dict[str, Any]:
    r = http.post("/completion", headers=_auth("acme"),
                  json={"model": "chat", "prompt": PROMPT, "n_predict": 4})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_save_erase_restore_and_reuse(serve: Callable[..., LiveServer], tmp_path: Path) -> None:
    live = _server(serve, tmp_path)
    with live.client() as http:
        first = _complete(http)
        held = first["usage"]["prompt_tokens"] + 4 - 1  # the last token was never fed
        r = http.post("/slots/0?action=save", headers=_auth("acme"),
                      json={"filename": "system.bin"})
        assert r.status_code == 200, r.text
        saved = r.json()
        assert saved["id_slot"] == 0 and saved["filename"] == "system.bin"
        assert saved["n_saved"] == held
        assert saved["n_written"] == (tmp_path / "system.bin").stat().st_size
        assert saved["timings"]["save_ms"] >= 0
        erased = http.post("/slots/0?action=erase", headers=_auth("acme"))
        assert erased.json() == {"id_slot": 0, "n_erased": held}
        before = _hits(live)
        assert _native(http)["timings"]["cache_n"] == 0  # erased: nothing to reuse
        assert _hits(live) == before
        http.post("/slots/0?action=erase", headers=_auth("acme"))
        r = http.post("/slots/2?action=restore", headers=_auth("acme"),
                      json={"filename": "system.bin"})
        assert r.status_code == 200, r.text
        assert r.json()["n_restored"] == held and r.json()["id_slot"] == 2
        assert r.json()["n_read"] == saved["n_written"]
        [restored] = [s for s in http.get("/slots", headers=_auth("acme")).json()
                      if s["id"] == 2]
        assert restored["n_prompt_tokens"] == held and not restored["is_processing"]
        reused = _native(http)
        assert reused["timings"]["cache_n"] >= first["usage"]["prompt_tokens"] - 1
        assert _hits(live) - before >= first["usage"]["prompt_tokens"] - 1
        assert reused["content"] == first["choices"][0]["text"]


def test_slot_refusals_then_a_request_is_served(serve: Callable[..., LiveServer],
                                                tmp_path: Path) -> None:
    live = _server(serve, tmp_path, step_fixed_s=0.02)
    (tmp_path / "junk.bin").write_bytes(b"not a saved slot")
    with live.client() as http:
        _complete(http, "acme")
        acme, zeta = _auth("acme"), _auth("zeta")
        bad = [
            ("/slots/0?action=save", {}, 400, "filename"),
            ("/slots/0?action=save", {"filename": "../escape.bin"}, 400, "filename"),
            ("/slots/0?action=save", {"filename": "sub/dir.bin"}, 400, "filename"),
            ("/slots/0?action=save", {"filename": " x.bin"}, 400, "filename"),
            ("/slots/0?action=save", {"filename": "a\nb.bin"}, 400, "filename"),
            ("/slots/4?action=save", {"filename": "a.bin"}, 400, "slot"),
            ("/slots/0?action=restore", {"filename": "missing.bin"}, 404, "missing.bin"),
            ("/slots/1?action=restore", {"filename": "junk.bin"}, 400, "junk.bin"),
            ("/slots/0?action=save", {"filename": "a.bin", "model": "nope"}, 404, "nope"),
        ]
        types = {400: "invalid_request_error", 404: "not_found_error"}
        for path, body, status, text in bad:
            assert_llama_error(http.post(path, headers=acme, json=body), status, types[status],
                               text)
        assert not (tmp_path.parent / "escape.bin").exists()
        # another tenant's prompt is not saved for it
        other = http.post("/slots/0?action=save", headers=zeta, json={"filename": "z.bin"})
        assert_llama_error(other, 403, "permission_error", "another tenant")
        # a slot serving a request is neither erased nor restored into
        started = threading.Event()

        def stream() -> None:
            body = {"model": "chat", "prompt": "a b c", "max_tokens": 150, "stream": True}
            with httpx.Client(base_url=live.url, timeout=60, headers=acme) as c, \
                    c.stream("POST", "/v1/completions", json=body) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        started.set()

        t = threading.Thread(target=stream)
        t.start()
        assert started.wait(10)
        [busy] = wait_for(lambda: [s for s in range(4) if _running(live, s)])
        busy_restore = http.post(f"/slots/{busy}?action=restore", headers=acme,
                                 json={"filename": "junk.bin"})
        assert_llama_error(busy_restore, 503, "unavailable_error", "serving a request")
        assert busy_restore.headers["retry-after"] == "1"
        t.join(30)
        assert _complete(http)["choices"][0]["finish_reason"] == "length"


def _running(live: LiveServer, slot: int) -> bool:
    """Whether ``slot`` of the model's engine runs a sequence (read on the worker thread)."""
    future = live.runtime.on_engine("chat", 0, lambda e: e.slot_holding(slot).state)
    return bool(future.result(timeout=10) == "running")


def test_slot_files_are_off_without_a_slot_folder(serve: Callable[..., LiveServer]) -> None:
    live = _server(serve, None)
    with live.client() as http:
        _complete(http)
        for action in ("save", "restore"):
            r = http.post(f"/slots/0?action={action}", headers=_auth("acme"),
                          json={"filename": "../../etc/passwd"})
            assert_llama_error(r, 501, "not_supported_error", "--slot-save-path")
        erased = http.post("/slots/0?action=erase", headers=_auth("acme"))
        assert erased.status_code == 200 and erased.json()["n_erased"] > 0
        assert _complete(http)["object"] == "text_completion"
