"""llama-server's ``return_progress`` on every stream that has it, over HTTP against a real
uvicorn server on the synthetic backend with short prefill chunks: ``prompt_progress``
chunks (the engine's reports: one at the start, one per pass that feeds the prompt) come
before the first token on ``/chat/completions``, ``/completion`` (with ``timings`` under
``timings_per_token``) and the Responses stream (``response.in_progress`` events); a
request that does not ask, or does not stream, gets none."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

from tests.server.live import LiveServer, config_with, sse_data, synth_chat

CHUNK_TOKENS = 16


def prompt(lead: str) -> str:
    """A prompt that shares no prefix with another test's (a retained prefix would be the
    first report's cache)."""
    return lead + " This is a test" * 6


@pytest.fixture(scope="module")
def live(serve_module: Callable[..., LiveServer]) -> LiveServer:
    return serve_module(config_with(
        models=[synth_chat("bytes", byte_tokens=True, vocab_size=300)], workers={"count": 1},
        engine={"prefill_chunk_tokens": CHUNK_TOKENS, "max_batch_tokens": CHUNK_TOKENS}))


def _stream(live: LiveServer, path: str, body: dict[str, Any]) -> list[Any]:
    with live.client() as c, c.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        return sse_data(line for line in r.iter_lines() if not line.startswith("event:"))


def _check_reports(reports: list[dict[str, Any]], prompt_tokens: int) -> None:
    """From nothing computed to the whole prompt, one chunk of the engine at a time."""
    assert reports[0]["processed"] == reports[0]["cache"] == 0
    assert reports[-1]["processed"] == reports[-1]["total"] == prompt_tokens
    steps = [b["processed"] - a["processed"] for a, b in itertools.pairwise(reports)]
    assert steps and all(0 < s <= CHUNK_TOKENS for s in steps)
    assert len(reports) == 1 + -(-prompt_tokens // CHUNK_TOKENS)
    times = [r["time_ms"] for r in reports]
    assert times == sorted(times) and times[0] >= 0


def test_chat_stream_reports_progress_before_the_first_token(live: LiveServer) -> None:
    chunks = _stream(live, "/chat/completions", {
        "messages": [{"role": "user", "content": prompt("chat")}], "max_tokens": 3, "stream": True,
        "return_progress": True, "stream_options": {"include_usage": True}})
    progress = [c for c in chunks if isinstance(c, dict) and "prompt_progress" in c]
    n_prompt = chunks[-2]["usage"]["prompt_tokens"]
    _check_reports([c["prompt_progress"] for c in progress], n_prompt)
    for c in progress:  # llama-server's shape: a role delta carrying the progress
        assert c["choices"][0]["delta"] == {"role": "assistant", "content": None}
    first_text = next(i for i, c in enumerate(chunks)
                      if isinstance(c, dict) and c["choices"]
                      and c["choices"][0]["delta"].get("content"))
    assert chunks.index(progress[-1]) < first_text


def test_native_completion_progress_has_timings(live: LiveServer) -> None:
    chunks = _stream(live, "/completion", {"prompt": prompt("native"), "n_predict": 2,
                                           "stream": True, "return_progress": True,
                                           "timings_per_token": True})
    progress = [c for c in chunks if "prompt_progress" in c]
    _check_reports([c["prompt_progress"] for c in progress], chunks[-1]["tokens_evaluated"])
    first = progress[0]["timings"]
    assert (first["prompt_n"], first["prompt_ms"], first["predicted_n"]) == (0, 0.0, 0)
    prompt_ms = [c["timings"]["prompt_ms"] for c in progress]
    assert prompt_ms == sorted(prompt_ms) and prompt_ms[-1] > 0
    assert all(v >= 0 for c in progress for v in c["timings"].values())
    assert all(c["content"] == "" and c["stop"] is False for c in progress)


def test_responses_stream_reports_progress_and_timings(live: LiveServer) -> None:
    events = _stream(live, "/responses", {"input": prompt("responses"), "max_output_tokens": 3,
                                          "stream": True, "return_progress": True,
                                          "timings_per_token": True})
    progress = [e for e in events if "prompt_progress" in e]
    assert progress and all(e["type"] == "response.in_progress" for e in progress)
    done = events[-1]
    assert done["type"] in ("response.completed", "response.incomplete")
    _check_reports([e["prompt_progress"] for e in progress],
                   done["response"]["usage"]["input_tokens"])
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all("predicted_per_second" in e["timings"] for e in deltas)
    assert done["timings"]["predicted_n"] == done["response"]["usage"]["output_tokens"]


@pytest.mark.parametrize("body", [
    {"stream": True},
    {"stream": False, "return_progress": True},
])
def test_no_progress_unless_a_stream_asks(live: LiveServer, body: dict[str, Any]) -> None:
    request = {"messages": [{"role": "user", "content": prompt("none")}], "max_tokens": 2,
               **body}
    if body["stream"]:
        chunks = _stream(live, "/chat/completions", request)
        assert not any(isinstance(c, dict) and "prompt_progress" in c for c in chunks)
    else:
        with live.client() as c:
            r = c.post("/chat/completions", json=request)
        assert r.status_code == 200 and "prompt_progress" not in r.text


def test_progress_crosses_from_a_worker_process(serve: Callable[..., LiveServer]) -> None:
    """With ``workers.isolation = "process"`` the reports come over the worker's pipe as
    its tokens do."""
    live = serve(config_with(
        models=[synth_chat("bytes", byte_tokens=True, vocab_size=300)],
        workers={"count": 1, "isolation": "process"},
        engine={"prefill_chunk_tokens": CHUNK_TOKENS, "max_batch_tokens": CHUNK_TOKENS}))
    chunks = _stream(live, "/completion", {"prompt": prompt("process"), "n_predict": 2,
                                           "stream": True, "return_progress": True})
    _check_reports([c["prompt_progress"] for c in chunks if "prompt_progress" in c],
                   chunks[-1]["tokens_evaluated"])
