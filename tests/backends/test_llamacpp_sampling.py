"""Issue 12's engine features on the real model (packaged Gemma 3 270M, a base model):
prompt logits from ``all_logits`` chunks, a JSON-schema answer that parses and validates,
seeded reproducibility, ``n`` choices sharing one prefill, and echo prompt logprobs that
match a solo forward."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from typing import Any

import jsonschema
import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the 'llm' extra)")

from sluice.backends.base import ForwardChunk, ModelSpec
from sluice.backends.llamacpp import LlamaCppBackend, LlamaCppGenerative
from sluice.engine.continuous import ContinuousEngine, EngineConfig
from sluice.engine.request import Constraint, Request, RequestStatus, SamplingParams

pytestmark = pytest.mark.llm

MARGIN = 1.0  # the margin rule of tests/backends/test_llamacpp.py
TOLERANCE_NATS = 0.35
"""How far one token's logprob moves between passes of different sizes (measured: up to
0.2 nats for the next prompt token; whole rows differ by up to ~1 nat far in the tail)."""
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "city": {"type": "string"},
        "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["name", "age", "city", "hobbies"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def model() -> Iterator[LlamaCppGenerative]:
    spec = ModelSpec("gemma-3-270m", "generative", "llamacpp", 400 * 2**20,
                     options={"path": "packaged:gemma-3-270m", "chat_template": "gemma",
                              "n_ctx": 2048, "n_seq_max": 4, "n_threads": 2})
    loaded = LlamaCppBackend().load(spec)
    yield loaded
    loaded.close()


@pytest.fixture
def fresh(model: LlamaCppGenerative) -> LlamaCppGenerative:
    for slot in range(model.n_seq_max):
        model.release_sequence(slot)
    return model


_ids = iter(range(1, 10**9))


def make_request(model: LlamaCppGenerative, text: str, **params: Any) -> Request:
    req = Request(request_id=next(_ids), model_id="gemma", kind="generative",
                  arrival_s=0.0, prompt_tokens=tuple(model.tokenize(text, add_bos=True)),
                  params=SamplingParams(**params))
    req.mark_queued(0.0)
    return req


def run_all(model: LlamaCppGenerative, reqs: Sequence[Request], **config: Any) -> None:
    # retain_prefixes off: every slot is released at the end, for the model's next use
    eng = ContinuousEngine(model, EngineConfig(**{"retain_prefixes": False, **config}),
                           time.monotonic, lambda r: None)
    for req in reqs:
        eng.add(req)
    steps = 0
    while eng.has_work and steps < 2000:
        eng.step()
        steps += 1
    assert eng.kv.free_blocks == eng.kv.total_blocks
    eng.kv.check_integrity()


def chat(model: LlamaCppGenerative, question: str) -> str:
    return model.render_chat([{"role": "user", "content": question}])


def log_softmax(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64)
    return row - (row.max() + np.log(np.exp(row - row.max()).sum()))


def test_all_logits_rows_match_one_prefix_forward_each(fresh: LlamaCppGenerative) -> None:
    prompt = fresh.tokenize("The capital of France is the city of", add_bos=True)
    other = fresh.tokenize("Once upon a time", add_bos=True)
    # slot 1's all-logits chunk after slot 0's plain one, given in reverse slot order
    out = fresh.forward([ForwardChunk(1, tuple(prompt), 0, True, all_logits=True),
                         ForwardChunk(0, tuple(other), 0, True)]).copy()  # kept past forward
    assert out.shape == (len(prompt) + 1, fresh.vocab_size)
    for cut in range(2, len(prompt)):
        fresh.release_sequence(2)
        solo = log_softmax(fresh.forward([ForwardChunk(2, tuple(prompt[:cut]), 0, True)])[0])
        gaps = [np.abs(log_softmax(out[k]) - solo).max() for k in (cut - 2, cut - 1, cut)]
        assert gaps[1] < min(gaps[0], gaps[2]) / 4  # row cut-1 is the one after prompt[:cut]
        if np.diff(np.sort(solo)[-2:])[0] > MARGIN:
            assert int(np.argmax(out[cut - 1])) == int(np.argmax(solo))
        # llama.cpp's kernels differ with the number of tokens in a pass: the logprob of
        # the next prompt token agrees to a few tenths of a nat, not bit for bit
        assert log_softmax(out[cut - 1])[prompt[cut]] == pytest.approx(solo[prompt[cut]],
                                                                       abs=TOLERANCE_NATS)
    fresh.release_sequence(2)
    alone = fresh.forward([ForwardChunk(2, tuple(other), 0, True)])[0]
    assert int(np.argmax(out[-1])) == int(np.argmax(alone))


@pytest.mark.parametrize("max_tokens", [80, 30])
def test_a_json_schema_answer_parses_and_validates(fresh: LlamaCppGenerative,
                                                   max_tokens: int) -> None:
    """80 tokens leave room for the model's own answer; 30 make the engine steer to a
    close before the budget ends. Either way the answer parses and validates."""
    constraint = Constraint("json_schema", json.dumps(PERSON), strict=True)
    reqs = [make_request(fresh, chat(fresh, "Describe a fictional person as JSON."),
                         max_tokens=max_tokens, temperature=t, seed=s, constraint=constraint)
            for t, s in ((0.0, None), (0.8, 1), (1.0, 2))]
    run_all(fresh, reqs)
    for req in reqs:
        assert req.final is not None and req.final.status == RequestStatus.COMPLETED, req.final
        doc = json.loads(req.final.text)
        jsonschema.validate(doc, PERSON)
        assert req.final.completion_tokens <= max_tokens


def test_json_object_from_a_base_model_parses(fresh: LlamaCppGenerative) -> None:
    req = make_request(fresh, "A JSON object with a list of three fruits:", max_tokens=60,
                       temperature=0.7, seed=5, constraint=Constraint("json_object"))
    run_all(fresh, [req])
    assert req.final is not None and isinstance(json.loads(req.final.text), dict)


def test_same_seed_same_text_alone_and_in_the_same_batch(fresh: LlamaCppGenerative) -> None:
    params = {"max_tokens": 16, "temperature": 0.9, "top_p": 0.95, "seed": 1234,
              "presence_penalty": 0.5, "repetition_penalty": 1.1}
    prompt = "Once upon a time, in a small village by the sea,"

    def texts(batch: int) -> list[str]:
        reqs = [make_request(fresh, prompt, **params)]
        reqs += [make_request(fresh, f"Item {i}: the weather is", max_tokens=16,
                              temperature=0.9, seed=i) for i in range(batch - 1)]
        run_all(fresh, reqs)
        return [r.final.text for r in reqs if r.final]

    alone = texts(1)
    assert alone == texts(1)
    batched = texts(3)
    assert batched == texts(3)  # the same composition reproduces exactly
    other_seed = make_request(fresh, prompt, **{**params, "seed": 99})
    run_all(fresh, [other_seed])
    assert other_seed.final and other_seed.final.text != alone[0]


class CountingModel:
    """Wraps the model's forward to count the prompt tokens fed to each slot."""

    def __init__(self, model: LlamaCppGenerative) -> None:
        self.model = model
        self.prefill: list[tuple[int, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    def forward(self, chunks: Sequence[ForwardChunk]) -> np.ndarray:
        self.prefill.extend((c.seq_slot, len(c.tokens)) for c in chunks if len(c.tokens) > 1)
        return self.model.forward(chunks)


def test_n_choices_share_one_prefill(fresh: LlamaCppGenerative) -> None:
    counting = CountingModel(fresh)
    req = make_request(fresh, "Three ideas for a birthday party: 1.", max_tokens=12,
                       temperature=1.0, seed=7, n=2)
    run_all(counting, [req])  # type: ignore[arg-type]
    final = req.final
    assert final is not None and final.status == RequestStatus.COMPLETED
    assert counting.prefill == [(0, len(req.prompt_tokens))]  # computed once, in slot 0
    assert len(final.choices) == 2 and all(c.text for c in final.choices)
    assert final.choices[0].text != final.choices[1].text
    assert final.prompt_tokens == len(req.prompt_tokens)
    assert final.completion_tokens == sum(c.completion_tokens for c in final.choices)
    assert fresh.slot_len == [0] * fresh.n_seq_max  # every slot released


def test_echo_prompt_logprobs_match_a_solo_forward(fresh: LlamaCppGenerative) -> None:
    text = "The quick brown fox jumps over the lazy dog because it was in a hurry."
    req = make_request(fresh, text, max_tokens=1, temperature=0.0, prompt_logprobs=True)
    run_all(fresh, [req], prompt_logprobs_chunk_tokens=5)
    final = req.final
    assert final is not None and final.prompt_logprobs[0] is None
    prompt = req.prompt_tokens
    assert len(final.prompt_logprobs) == len(prompt)
    solo = fresh.forward([ForwardChunk(0, tuple(prompt), 0, True, all_logits=True)]).copy()
    fresh.release_sequence(0)
    for pos in range(1, len(prompt)):
        entry = final.prompt_logprobs[pos]
        assert entry is not None and entry.token_id == prompt[pos]
        expected = log_softmax(solo[pos - 1])[prompt[pos]]
        assert entry.logprob == pytest.approx(expected, abs=TOLERANCE_NATS), pos
    # a likely continuation is likely: "dog" after "the lazy"
    dog = final.prompt_logprobs[prompt.index(fresh.tokenize(" dog", add_bos=False)[0])]
    assert dog is not None and dog.logprob > -2.0
