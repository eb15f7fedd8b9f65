"""A short schemathesis run against the server's own OpenAPI schema on 127.0.0.1 (the
long one is ``bench/fuzz.py``), every operation in it (Anthropic Messages, count_tokens and
Responses included): no 5xx (the deadline refusals aside, see there), no hang (a 30 s
request timeout), and every response conforms to the declared status codes, content types
and schemas."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.server.live import LiveServer, config_with, synth_chat, synth_embed, wait_for

pytest.importorskip("schemathesis", reason="schemathesis is not installed (the dev extra)")

from bench.fuzz import fuzz, schemathesis_bin

MAX_EXAMPLES = 8
MAX_TIME_S = 45


def test_schemathesis_finds_no_server_error_and_no_schema_violation(
    serve: Callable[..., LiveServer], tmp_path: Path,
) -> None:
    if not Path(schemathesis_bin()).exists() and shutil.which("schemathesis") is None:
        pytest.skip("the schemathesis command is not installed")
    live = serve(config_with(
        # byte tokens: the synthetic vocabulary can then follow a grammar, so generated
        # json_schema / grammar / response_format bodies are decoded, not failed
        models=[synth_chat(step_fixed_s=0.0005, decode_per_seq_s=0.0001, load_s=0.0,
                           byte_tokens=True, vocab_size=300),
                synth_embed(batch_fixed_s=0.0005, per_item_s=0.0001, load_s=0.0)],
        workers={"count": 1, "inbox_capacity": 16},
        # open_admin: the admin routes are fuzzed too (without it they answer only 403)
        server={"default_model": "synth-chat", "open_admin": True, "openapi": True}))
    result = fuzz(live.url, max_examples=MAX_EXAMPLES, max_time_s=MAX_TIME_S,
                  report_dir=tmp_path)
    assert result["exit_code"] == 0, result["output_tail"]
    assert result["operations"] >= 8, result["output_tail"]
    # every API's generative routes are among them, Anthropic's and Responses' included
    assert {"POST /v1/chat/completions", "POST /v1/messages", "POST /v1/messages/count_tokens",
            "POST /v1/responses", "POST /api/chat"} <= set(result["operation_names"])
    assert result["failed_operations"] == []
    with live.client() as c:
        assert c.get("/health").status_code == 200
        wait_for(lambda: c.get("/status.json").json()["live_requests"] == 0)
