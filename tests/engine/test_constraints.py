"""Constrained decoding on the synthetic model with a byte vocabulary (ids 3..258 are the
256 bytes): every answer parses and validates, EOS only where the grammar accepts, the
``max_tokens`` budget steers to a close, and grammar faults stay with their request."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import numpy as np
import pytest

from sluice.backends.base import ModelSpec
from sluice.backends.synthetic import SyntheticGenerative, SyntheticTokenizer
from sluice.engine import constraints as constraints_module
from sluice.engine.constraints import (
    CLOSE_HORIZON_TOKENS,
    ConstraintError,
    GrammarFailure,
    check_constraint,
)
from sluice.engine.request import Constraint, Request, RequestStatus
from tests.engine.test_continuous import engine, request, run_to_idle

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 30},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "kind": {"enum": ["cat", "dog"]},
    },
    "required": ["name", "age", "tags", "kind"],
    "additionalProperties": False,
}
JSON_SCHEMA = Constraint("json_schema", json.dumps(SCHEMA), strict=True)


def byte_model(**options: Any) -> SyntheticGenerative:
    opts = {"speed_scale": 0.0, "n_seq_max": 4, "n_ctx_per_seq": 512, "byte_tokens": True,
            "vocab_size": 300, **options}
    return SyntheticGenerative(ModelSpec("chat", "generative", "synthetic", 1, options=opts))


def run(constraint: Constraint, model: SyntheticGenerative | None = None,
        **params: Any) -> Request:
    eng, _ = engine(model or byte_model())
    req = request(constraint=constraint, **{"max_tokens": 200, **params})
    eng.add(req)
    run_to_idle(eng, limit=2000)
    assert eng.kv.free_blocks == eng.kv.total_blocks
    return req


def answer(req: Request) -> str:
    assert req.final is not None and req.final.status == RequestStatus.COMPLETED, req.final
    return req.final.text


@pytest.mark.parametrize("params", [
    {"temperature": 0.0}, *({"temperature": 1.0, "seed": s} for s in range(4)),
    {"temperature": 0.7, "top_p": 0.9, "seed": 9, "presence_penalty": 1.0},
])
def test_json_schema_answers_parse_and_validate(params: dict[str, Any]) -> None:
    req = run(JSON_SCHEMA, **params)
    doc = json.loads(answer(req))
    jsonschema.validate(doc, SCHEMA)


@pytest.mark.parametrize("max_tokens", [52, 60, CLOSE_HORIZON_TOKENS + 40])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_budget_running_out_still_closes_the_json(max_tokens: int,
                                                     temperature: float) -> None:
    """Left alone, this model writes the first string until the budget ends it (the
    shortest complete answer is 49 single-byte tokens): the engine steers to a close in
    time, so the answer parses and validates."""
    req = run(JSON_SCHEMA, max_tokens=max_tokens, temperature=temperature, seed=3)
    jsonschema.validate(json.loads(answer(req)), SCHEMA)
    assert req.final is not None and req.final.completion_tokens <= max_tokens


def test_a_budget_below_any_complete_answer_ends_by_length() -> None:
    req = run(JSON_SCHEMA, max_tokens=30, temperature=0.0)
    assert req.final and req.final.finish_reason == "length"
    assert req.final.completion_tokens == 30


def test_eos_only_where_the_grammar_accepts() -> None:
    """This model wants EOS from position 6 on; the grammar holds it off until the object
    is complete, then the sequence ends with ``stop``."""
    eager = byte_model(eos_at_pos=6)
    req = run(Constraint("json_object"), eager, temperature=0.0, max_tokens=100)
    assert isinstance(json.loads(answer(req)), dict)
    assert req.final and req.final.finish_reason == "stop"
    unconstrained = request(max_tokens=100)
    eng, _ = engine(byte_model(eos_at_pos=6))
    eng.add(unconstrained)
    run_to_idle(eng)
    assert unconstrained.final and unconstrained.final.completion_tokens <= 2


def test_regex_and_lark_constraints() -> None:
    pattern = r"[a-c]{3}-[0-9]{2}"
    req = run(Constraint("regex", pattern), temperature=1.0, seed=1)
    assert re.fullmatch(pattern, answer(req))
    assert req.final and req.final.finish_reason == "stop"  # the grammar was done
    lark = 'start: "yes" | "no" | "maybe"\n'
    assert answer(run(Constraint("lark", lark), temperature=1.0, seed=2)) in {
        "yes", "no", "maybe"}


def test_choices_each_follow_the_grammar() -> None:
    req = run(JSON_SCHEMA, n=3, temperature=1.0, seed=5, max_tokens=60)
    assert req.final is not None and len(req.final.choices) == 3
    for choice in req.final.choices:
        jsonschema.validate(json.loads(choice.text), SCHEMA)


@pytest.mark.parametrize(("constraint", "message"), [
    (Constraint("json_schema", "{not json"), "not valid JSON"),
    (Constraint("json_schema", "[1, 2]"), "must be a JSON object"),
    (Constraint("json_schema", '{"type": "strang"}', strict=True), "strang"),
    (Constraint("regex", "(unclosed"), "regex"),
    (Constraint("lark", "start: missing_rule"), "missing_rule"),
    (Constraint("xml", ""), "unknown constraint kind"),  # type: ignore[arg-type]
])
def test_check_constraint_gives_a_client_message(constraint: Constraint, message: str) -> None:
    tokenizer = SyntheticTokenizer(byte_model().spec)
    with pytest.raises(ConstraintError, match=message):
        check_constraint(constraint, tokenizer)
    assert isinstance(ConstraintError("x"), ValueError)
    check_constraint(JSON_SCHEMA, tokenizer)  # a good one compiles


def test_non_strict_schemas_ignore_keywords_the_engine_does_not_implement() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False, "x-unknown-keyword": 1,
              "dependentSchemas": {"a": {"required": ["b"]}}}
    tokenizer = SyntheticTokenizer(byte_model().spec)
    with pytest.raises(ConstraintError):
        check_constraint(Constraint("json_schema", json.dumps(schema), strict=True), tokenizer)
    lenient = Constraint("json_schema", json.dumps(schema), strict=False)
    check_constraint(lenient, tokenizer)
    assert isinstance(json.loads(answer(run(lenient, temperature=0.0)))["a"], int)


def test_a_bad_grammar_or_a_grammar_fault_fails_that_request_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    eng, _ = engine(byte_model())
    bad = request(constraint=Constraint("regex", "(unclosed"), max_tokens=10)
    good = request(constraint=JSON_SCHEMA, max_tokens=80)
    plain = request(max_tokens=10)
    for r in (bad, good, plain):
        eng.add(r)
    run_to_idle(eng)
    assert bad.final and bad.final.status == RequestStatus.FAILED
    assert bad.final.error_code == "invalid_request_error"
    assert "response_format" in (bad.final.error or "")
    assert good.final and good.final.status == RequestStatus.COMPLETED
    assert plain.final and plain.final.status == RequestStatus.COMPLETED

    real_advance = constraints_module.GrammarState.advance
    calls = {"n": 0}

    def flaky_advance(self: constraints_module.GrammarState, token: int) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise GrammarFailure("the grammar engine broke")
        real_advance(self, token)

    monkeypatch.setattr(constraints_module.GrammarState, "advance", flaky_advance)
    broken = request(constraint=JSON_SCHEMA, max_tokens=40)
    neighbour = request(max_tokens=10)
    eng.add(broken)
    eng.add(neighbour)
    run_to_idle(eng)
    assert broken.final and broken.final.status == RequestStatus.FAILED
    assert broken.final.error_code == "grammar_error"
    assert neighbour.final and neighbour.final.status == RequestStatus.COMPLETED
    assert eng.kv.free_blocks == eng.kv.total_blocks


@pytest.mark.parametrize("prefix", [
    "", '{"name": "Bob the', '{"name": "Bob", "age": 3', '{"name": "x", "age": 12, "tags": [',
    '{"name": "x", "age": 1, "tags": ["a", "bc', '{"name": "x", "age": 1, "tags": [], "kind": "d',
])
def test_a_closing_path_completes_any_state_to_a_valid_answer(prefix: str) -> None:
    model = byte_model()
    grammar = constraints_module.start_grammar(JSON_SCHEMA, model)
    for token in model.tokenize(prefix, add_bos=False):
        grammar.advance(token)
    path = grammar.closing_path(grammar._matcher, 80)
    assert path is not None
    tail = b"".join(model.token_bytes(t) for t in path).decode()
    jsonschema.validate(json.loads(prefix + tail), SCHEMA)


def test_a_bitmask_forbids_exactly_its_zero_bits() -> None:
    from sluice.engine.constraints.masking import apply_bitmask, is_allowed

    rng = np.random.default_rng(4)
    mask = rng.integers(-(2**31), 2**31, size=10, dtype=np.int64).astype(np.int32)
    row = rng.normal(size=300).astype(np.float32)
    masked = row.copy()
    apply_bitmask(masked, mask)
    for t in range(300):
        assert (masked[t] == row[t]) if is_allowed(mask, t) else np.isneginf(masked[t])


@pytest.mark.parametrize("params", [
    {"temperature": 0.0}, {"temperature": 1.0}, {"temperature": 0.7, "top_p": 0.9},
    {"temperature": 1.3, "top_k": 5}, {"temperature": 1.0, "min_p": 0.05},
])
def test_sampling_among_the_allowed_tokens_is_the_same_draw_as_masking(
    params: dict[str, Any],
) -> None:
    """The engine samples among a grammar's few allowed tokens instead of a masked row:
    for the same random stream the token is the same."""
    from sluice.engine.request import SamplingParams
    from sluice.engine.sampling import sample_token

    rng = np.random.default_rng(11)
    row = rng.normal(scale=3, size=262_144).astype(np.float32)
    allowed = np.sort(rng.choice(row.size, size=300, replace=False))
    masked = np.full_like(row, -np.inf)
    masked[allowed] = row[allowed]
    p = SamplingParams(**params)
    for seed in range(40):
        full = sample_token(masked, p, np.random.default_rng(seed))
        sub = int(allowed[sample_token(row[allowed], p, np.random.default_rng(seed))])
        assert full == sub
