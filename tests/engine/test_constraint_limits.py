"""The constraint limits without a server: each limit is found on the schema's text and
JSON before any compile, at its boundary exactly; the compiled-grammar cache is bounded by
the schema bytes it holds."""

from __future__ import annotations

import json

import pytest

from sluice.backends.base import ModelSpec, TokenTable
from sluice.backends.synthetic import SyntheticTokenizer
from sluice.engine import constraints as constraints_module
from sluice.engine.constraints import ConstraintLimitError, ConstraintLimits, check_constraint
from sluice.engine.constraints.limits import SizedCache, check_limits
from sluice.engine.request import Constraint


class _OneTable(SyntheticTokenizer):
    """The synthetic byte tokenizer with one token table (a GGUF tokenizer's is built once),
    so its grammar vocabulary, and so the cache's key, stays the same."""

    def token_table(self) -> TokenTable:
        if not hasattr(self, "_table"):
            self._table = super().token_table()
        return self._table


TOK = _OneTable(ModelSpec("s", "generative", "synthetic", 1,
                          options={"byte_tokens": True, "vocab_size": 300}))


def schema(value: object) -> Constraint:
    return Constraint("json_schema", json.dumps(value))


def limit_of(constraint: Constraint, limits: ConstraintLimits) -> str | None:
    try:
        check_limits(constraint, limits)
    except ConstraintLimitError as exc:
        return exc.limit
    return None


def test_each_limit_at_its_boundary() -> None:
    text = schema({"type": "string", "description": "x" * 100})
    size = len(text.spec.encode())
    assert limit_of(text, ConstraintLimits(max_schema_bytes=size)) is None
    assert limit_of(text, ConstraintLimits(max_schema_bytes=size - 1)) == "max_schema_bytes"
    deep: object = {"type": "integer"}
    for _ in range(9):  # 1 + 2 * 9 = 19 levels of objects
        deep = {"properties": {"a": deep}}
    assert limit_of(schema(deep), ConstraintLimits(max_schema_depth=19)) is None
    assert limit_of(schema(deep), ConstraintLimits(max_schema_depth=18)) == "max_schema_depth"
    alts = schema({"anyOf": [{"type": "integer"}, {"enum": [1, 2, 3]}],
                   "oneOf": [{"type": "string"}], "allOf": [{}, {}]})  # 2 + 3 + 1 + 2
    assert limit_of(alts, ConstraintLimits(max_schema_alternatives=8)) is None
    assert limit_of(alts, ConstraintLimits(max_schema_alternatives=7)) == \
        "max_schema_alternatives"
    regex = Constraint("regex", "a" * 50)
    assert limit_of(regex, ConstraintLimits(max_schema_bytes=49)) == "max_schema_bytes"


def test_json_nested_past_the_parsers_recursion_is_too_deep() -> None:
    spec = "[" * 200_000 + "]" * 200_000
    assert limit_of(Constraint("json_schema", spec),
                    ConstraintLimits(max_schema_bytes=10**6)) == "max_schema_depth"


def test_a_slow_compile_is_refused_and_not_kept() -> None:
    c = schema({"type": "object", "properties": {"slow": {"type": "integer"}}})
    with pytest.raises(ConstraintLimitError, match=r"constraints\.max_compile_ms"):
        check_constraint(c, TOK, ConstraintLimits(max_compile_ms=1e-6))
    assert constraints_module._CACHE.get((c, constraints_module.ll_tokenizer(TOK))) is None
    check_constraint(c, TOK)  # the default limit compiles and keeps it
    assert constraints_module._CACHE.get((c, constraints_module.ll_tokenizer(TOK))) is not None


def test_the_cache_is_bounded_by_weight_least_recently_used_out() -> None:
    cache: SizedCache[str, int] = SizedCache(10, len)
    for key in ("aaaa", "bbbb", "cc"):
        cache.put(key, len(key))
    assert cache.held == 10 and len(cache) == 3
    assert cache.get("aaaa") == 4  # now the most recently used
    cache.put("ddd", 3)
    assert cache.get("bbbb") is None and cache.get("aaaa") == 4
    assert cache.held <= 10
    cache.put("x" * 11, 11)  # heavier than the whole budget: never kept
    assert cache.get("x" * 11) is None and cache.held <= 10


def test_the_grammar_cache_holds_at_most_its_budget() -> None:
    budget = constraints_module._CACHE.budget
    for i in range(12):
        big = {"anyOf": [{"type": "object", "properties": {f"k{i}_{j}": {"type": "string"}}}
                         for j in range(700)]}
        check_constraint(schema(big), TOK)
    assert constraints_module._CACHE.held <= budget
