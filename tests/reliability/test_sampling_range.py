"""The whole class of extreme-but-well-typed sampling values (issue 11, part 4), as
properties: hypothesis draws every sampling field across the whole range its schema admits
(boundaries and subnormals included: seeds of any size and sign, temperatures down to
5e-324, ``top_k`` past the vocabulary, ``top_p`` and ``min_p`` at their ends, penalties,
biases, ``n``, ``max_tokens``, stop strings, log-probabilities, response formats).

- Through the engine (synthetic backend, no HTTP), with values past the HTTP schema too:
  each request ends in exactly one terminal state, and the same worker (never replaced)
  then serves a plain request.
- Over HTTP: every answer is a 200 or a 400 with the error shape (never a 500, never a
  hang); a plain request then succeeds; no worker died; the server's request counts equal
  the answers the client got.

A handful of the same extremes on the real model are in ``tests/llm/test_extreme_llm.py``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.engine.request import Constraint, Final, RequestStatus, SamplingParams
from sluice.engine.runtime import Runtime
from sluice.server.errors import final_error
from tests.engine.conftest import generative, make_runtime
from tests.server.live import (
    LiveServer,
    assert_error,
    config_with,
    metric_sum,
    scrape,
    start_server,
    synth_chat,
)

VOCAB = 512
N_SEQ_MAX = 4
CTX_PER_SEQ = 256
RESULT_TIMEOUT_S = 30.0

# -- strategies: each field over its whole schema range, ends and oddities included -------

SEEDS = st.one_of(st.none(), st.integers(), st.integers(-(2**256), 2**256),
                  st.sampled_from([-1, -(2**63) - 1, 2**63, 2**64 - 1, 2**64]))
TINY = [0.0, 5e-324, 1e-320, 1e-310, 1e-300, 1e-30, 1e-6, 1e-5]
TEMPERATURE = st.one_of(st.floats(0.0, 2.0), st.sampled_from([*TINY, 2.0]))
TOP_P = st.one_of(st.floats(0.0, 1.0, exclude_min=True),
                  st.sampled_from([5e-324, 1e-300, 1e-6, 1.0]))
TOP_K = st.one_of(st.integers(0, 100_000), st.sampled_from([0, 1, VOCAB - 1, VOCAB,
                                                            VOCAB + 1, 100_000]))
UNIT = st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.0, 5e-324, 1e-300, 1.0]))
PENALTY = st.one_of(st.floats(-2.0, 2.0), st.sampled_from([-2.0, 0.0, 2.0]))
REPETITION = st.one_of(st.floats(0.0, 10.0, exclude_min=True),
                       st.sampled_from([5e-324, 1e-300, 1.0, 10.0]))
BIAS = st.dictionaries(
    st.one_of(st.integers(0, VOCAB - 1), st.integers(0, 999_999_999)).map(str),
    st.one_of(st.floats(-100.0, 100.0), st.sampled_from([-100.0, 100.0])), max_size=6)
MAX_TOKENS = st.one_of(st.integers(1, 24), st.sampled_from([CTX_PER_SEQ, 1_000_000]))
STOP_TEXT = st.text(min_size=1, max_size=256)
STOP = st.one_of(st.none(), STOP_TEXT, st.lists(STOP_TEXT, max_size=4),
                 st.sampled_from([" w", "w1", "{", "\x00"]))
SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
    {"type": "string", "maxLength": 3},
    {"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}},  # refused: a 400
]
RESPONSE_FORMAT = st.one_of(
    st.none(), st.just({"type": "text"}), st.just({"type": "json_object"}),
    st.sampled_from(SCHEMAS).map(lambda s: {"type": "json_schema",
                                            "json_schema": {"name": "x", "schema": s}}))


@st.composite
def sampling_fields(draw: st.DrawFn) -> dict[str, Any]:
    """The sampling fields both OpenAI surfaces share, each drawn or left out."""
    fields = {
        "seed": SEEDS, "temperature": TEMPERATURE, "top_p": TOP_P, "top_k": TOP_K,
        "min_p": UNIT, "presence_penalty": PENALTY, "frequency_penalty": PENALTY,
        "repetition_penalty": REPETITION, "penalty_last_n": st.integers(-1, 1_000_000),
        "logit_bias": BIAS, "n": st.integers(1, 16), "max_tokens": MAX_TOKENS,
        "stop": STOP, "ignore_eos": st.booleans(),
    }
    return {k: draw(v) for k, v in fields.items() if draw(st.booleans())}


@st.composite
def chat_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body = draw(sampling_fields())
    if draw(st.booleans()):
        body["logprobs"] = True
        body["top_logprobs"] = draw(st.integers(0, 20))
    fmt = draw(RESPONSE_FORMAT)
    if fmt is not None:
        body["response_format"] = fmt
    return {**body, "messages": [{"role": "user", "content": draw(st.text(max_size=40))}]}


@st.composite
def completion_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body = draw(sampling_fields())
    if draw(st.booleans()):
        body["logprobs"] = draw(st.integers(0, 20))
    body["echo"] = draw(st.booleans())
    return {**body, "prompt": draw(st.text(max_size=40))}


# -- through the engine -------------------------------------------------------------------


@pytest.fixture(scope="module")
def runtime() -> Iterator[Runtime]:
    rt = make_runtime([generative("chat", n_seq_max=N_SEQ_MAX, n_ctx_per_seq=CTX_PER_SEQ,
                                  vocab_size=VOCAB, byte_tokens=True, step_fixed_s=0.0,
                                  decode_per_seq_s=0.0, prefill_per_token_s=0.0)])
    rt.start()
    yield rt
    rt.stop()


def engine_floats(lo: float, hi: float) -> st.SearchStrategy[float]:
    return st.one_of(st.floats(lo, hi), st.sampled_from([lo, hi, 5e-324, 1e-300]))


@st.composite
def engine_params(draw: st.DrawFn) -> SamplingParams:
    """Past the HTTP schema too: what another surface (gRPC, the Python API) may send."""
    kw: dict[str, Any] = {
        "max_tokens": draw(st.integers(1, 12)),
        "temperature": draw(st.one_of(TEMPERATURE, engine_floats(0.0, 1e308),
                                      st.just(math.inf))),
        "top_p": draw(TOP_P),
        "top_k": draw(st.one_of(TOP_K, st.integers(0, 2**62))),
        "seed": draw(SEEDS),
        "min_p": draw(UNIT),
        "presence_penalty": draw(st.one_of(PENALTY, engine_floats(-1e30, 1e30))),
        "frequency_penalty": draw(st.one_of(PENALTY, engine_floats(-1e30, 1e30))),
        "repetition_penalty": draw(st.one_of(REPETITION, engine_floats(1e-300, 1e300))),
        "penalty_last_n": draw(st.integers(-1, 1_000_000)),
        "logit_bias": tuple(draw(st.lists(st.tuples(st.integers(0, VOCAB - 1),
                                                    engine_floats(-1e30, 1e30)),
                                          max_size=4))),
        "logprobs": draw(st.booleans()),
        "top_logprobs": draw(st.integers(0, 20)),
        "n": draw(st.integers(1, N_SEQ_MAX)),
        "stop": tuple(draw(st.lists(STOP_TEXT, max_size=4))),
        "ignore_eos": draw(st.booleans()),
    }
    if draw(st.booleans()):
        kw["constraint"] = Constraint("json_object")
    return SamplingParams(**kw)


def run_to_end(rt: Runtime, params: SamplingParams, prompt: tuple[int, ...]) -> list[Final]:
    """Submit one request; the Final events its listener saw once it ended."""
    finals: list[Final] = []
    ended = threading.Event()

    def listen(event: Any) -> None:
        if isinstance(event, Final):
            finals.append(event)
            ended.set()

    req = rt.new_request("chat", prompt_tokens=prompt, params=params)
    req.listeners.append(listen)
    rt.submit(req, timeout_s=RESULT_TIMEOUT_S)
    assert ended.wait(RESULT_TIMEOUT_S), f"no terminal state for {params}"
    return finals


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(params=engine_params(), prompt=st.lists(st.integers(3, VOCAB - 1), min_size=1,
                                               max_size=8))
def test_any_sampling_values_end_in_one_state_and_the_worker_serves_on(
    runtime: Runtime, params: SamplingParams, prompt: list[int],
) -> None:
    worker = runtime.workers[0]
    finals = run_to_end(runtime, params, (1, *prompt))
    assert len(finals) == 1
    final = finals[0]
    assert final.status in (RequestStatus.COMPLETED, RequestStatus.FAILED), final
    if final.status == RequestStatus.FAILED:  # a clear reason, never a bare crash
        assert final.error and final.error_code in (
            "invalid_request_error", "internal_error", "grammar_error",
            "context_length_exceeded"), final
    plain = run_to_end(runtime, SamplingParams(max_tokens=2), (1, 5))
    assert [f.status for f in plain] == [RequestStatus.COMPLETED]
    assert runtime.workers[0] is worker and worker.is_alive()  # never replaced
    assert runtime.recoveries() == []


# -- over HTTP ------------------------------------------------------------------------------

MODEL = "synth-chat"


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    server = start_server(config_with(
        models=[synth_chat(MODEL, n_seq_max=N_SEQ_MAX, n_ctx_per_seq=CTX_PER_SEQ,
                           vocab_size=VOCAB, byte_tokens=True, step_fixed_s=0.0005,
                           decode_per_seq_s=0.0, prefill_per_token_s=0.0)],
        workers={"count": 1, "inbox_capacity": 8}))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(live: LiveServer) -> Iterator[httpx.Client]:
    with live.client(timeout=RESULT_TIMEOUT_S) as c:
        yield c


answers: dict[int, int] = {}
"""HTTP status → answers the HTTP property tests got (both surfaces, this module)."""


def check_answer(client: httpx.Client, path: str, body: dict[str, Any]) -> None:
    r = client.post(path, json={"model": MODEL, **body})
    answers[r.status_code] = answers.get(r.status_code, 0) + 1
    assert r.status_code in (200, 400), (body, r.text)
    if r.status_code == 400:
        assert_error(r, 400)
    else:
        choices = r.json()["choices"]
        assert len(choices) == body.get("n", 1)
        assert all(c["finish_reason"] in ("stop", "length") for c in choices), choices
    plain = client.post("/v1/completions", json={"model": MODEL, "prompt": "x",
                                                 "max_tokens": 2})
    answers[plain.status_code] = answers.get(plain.status_code, 0) + 1
    assert plain.status_code == 200, plain.text


HTTP_SETTINGS = settings(max_examples=120, deadline=None,
                         suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                HealthCheck.too_slow])


@HTTP_SETTINGS
@given(body=chat_bodies())
def test_chat_answers_any_sampling_values_with_200_or_400(
    client: httpx.Client, body: dict[str, Any],
) -> None:
    check_answer(client, "/v1/chat/completions", body)


@HTTP_SETTINGS
@given(body=completion_bodies())
def test_completions_answer_any_sampling_values_with_200_or_400(
    client: httpx.Client, body: dict[str, Any],
) -> None:
    check_answer(client, "/v1/completions", body)


def test_no_worker_died_and_the_counts_add_up(live: LiveServer, client: httpx.Client) -> None:
    """After the property tests above: the server counted what the client saw."""
    s = scrape(client)
    assert metric_sum(s, "sluice_worker_deaths_total") == 0
    assert live.runtime.recoveries() == []
    completed = metric_sum(s, "sluice_requests_total", state="completed")
    assert completed == answers.get(200, 0)
    assert metric_sum(s, "sluice_requests_total", state="failed") <= answers.get(400, 0)


def test_a_request_failed_by_its_own_parameters_in_the_engine_is_a_400() -> None:
    """What the engine's crash barrier calls the request's fault (``ValueError``: a bad
    parameter another surface let through) is a 4xx, not a 500."""
    err = final_error("invalid_request_error", "n must be between 1 and 4, got 9", "FAILED")
    assert (err.status, err.type, err.message) == (
        400, "invalid_request_error", "n must be between 1 and 4, got 9")
    assert final_error("internal_error", "the model's next-token logits are not a "
                       "distribution (NaN)", "FAILED").status == 500
