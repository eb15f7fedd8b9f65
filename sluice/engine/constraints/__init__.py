"""Constrained decoding: a ``Constraint`` (``json_object``, ``json_schema``, ``regex``,
``lark``) compiled by llguidance into a per-sequence grammar state that masks each step's
logits.

Why llguidance (numbers in ``bench/results/grammar_engines.json``, from
``bench/micro/grammar_engines.py`` on Gemma 3's 262,144-token vocabulary; summary in
``docs/benchmarks.md``): it computes a mask in tens of microseconds without compiling the
whole vocabulary ahead (an Earley parser over a token trie), handles every kind we need
(JSON schema, any JSON, regex, Lark CFG) in one engine, compiles a schema in milliseconds,
takes the GGUF vocabulary as plain bytes (it even ships a llama.cpp bridge reading the same
``llama_token_to_piece`` pieces), and is one dependency-free wheel. outlines-core spends
seconds to minutes building a regex index over 262k tokens and has no CFG (``json_object``
and recursive schemas become bounded regexes); xgrammar needs torch, transformers and
triton as hard dependencies; llama.cpp's grammar sampler walks every candidate token
through its stacks, milliseconds per token.

The contract (``check_constraint`` before admission, so a bad grammar is the client's
400; ``start_grammar`` when a sequence starts):

- A constraint past the server's limits (``ConstraintLimits``: schema bytes, nesting,
  alternatives, compile time) is refused naming the limit, before llguidance sees it (the
  compile time after it: that grammar is not kept). Compiled grammars are cached up to
  ``CACHE_SCHEMA_BYTES`` of their text (``limits.py``).
- JSON is compact with one space after ``,`` and ``:`` (``whitespace_flexible`` off: a small
  model given free whitespace can emit newlines forever). ``json_object`` is any JSON object.
  ``strict`` json_schema refuses a schema keyword llguidance does not implement; non-strict
  ignores it (lenient) and enforces the rest.
- EOS is allowed exactly where the grammar accepts; a sequence whose grammar can take no
  more tokens ends at once (finish reason ``stop``).
- The token budget: within ``CLOSE_HORIZON_TOKENS`` of ``max_tokens`` each sampled token
  is kept only if a way to close the grammar still fits in what is left (``closing_path``);
  otherwise the first token of the closing path is taken instead. So an answer cut by
  ``max_tokens`` still parses and validates (finish reason ``length``, as OpenAI, whose
  answer there is broken JSON). Only a budget too small for any complete answer ends
  unfinished.
- Stop strings still cut the text: a client that sends both asked for that.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Sequence

import llguidance
import numpy as np

from sluice.backends.base import Tokenizer
from sluice.engine.constraints.limits import (
    CACHE_ENTRY_OVERHEAD_BYTES,
    CACHE_SCHEMA_BYTES,
    ConstraintError,
    ConstraintLimitError,
    ConstraintLimits,
    SizedCache,
    check_limits,
)
from sluice.engine.constraints.masking import apply_bitmask, is_allowed, mask_words
from sluice.engine.constraints.vocab import ll_tokenizer
from sluice.engine.request import Constraint

__all__ = [
    "CLOSE_HORIZON_TOKENS",
    "ConstraintError",
    "ConstraintLimitError",
    "ConstraintLimits",
    "GrammarState",
    "apply_bitmask",
    "check_constraint",
    "start_grammar",
    "warm_vocabulary",
]

CLOSE_HORIZON_TOKENS = 48
"""How close to ``max_tokens`` a constrained sequence starts checking that it can close."""

SUBSET_TOKENS = 8192
"""At most this many allowed tokens: sample among them instead of masking the row."""

CLOSE_SEARCH_NODES = 400
"""Grammar states one closing search may visit."""

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

KINDS = ("json_object", "json_schema", "regex", "lark")


class GrammarFailure(RuntimeError):
    """A grammar state broke while decoding (that request's error)."""


def grammar_text(constraint: Constraint) -> str:
    """The llguidance grammar for ``constraint``; ``ConstraintError`` when its spec is
    not even well-formed (the engine's compile finds the deeper faults)."""
    kind = constraint.kind
    if kind == "json_object":
        return str(llguidance.LLMatcher.grammar_from_json_schema(
            {"type": "object"}, defaults=JSON_OPTIONS))  # type: ignore[arg-type]
    if kind == "json_schema":
        try:
            schema = json.loads(constraint.spec)
        except ValueError as exc:
            raise ConstraintError(f"the JSON schema is not valid JSON: {exc}") from None
        if not isinstance(schema, dict | bool):
            raise ConstraintError("the JSON schema must be a JSON object")
        options = {**JSON_OPTIONS, "lenient": not constraint.strict}
        try:
            return str(llguidance.LLMatcher.grammar_from_json_schema(
                schema, defaults=options))  # type: ignore[arg-type]
        except ValueError as exc:
            raise ConstraintError(f"the JSON schema cannot be used: {exc}") from None
    if kind == "regex":
        return str(llguidance.LLMatcher.grammar_from_regex(constraint.spec))
    if kind == "lark":
        return str(llguidance.LLMatcher.grammar_from_lark(constraint.spec))
    raise ConstraintError(f"unknown constraint kind {kind!r}; expected one of {KINDS}")


def check_constraint(constraint: Constraint, tokenizer: Tokenizer,
                     limits: ConstraintLimits | None = None) -> None:
    """Compile ``constraint`` for ``tokenizer``'s vocabulary (cached, so the engine's
    start is cheap); ``ConstraintError`` with a client-fit message if it cannot be, a
    ``ConstraintLimitError`` naming the limit if it breaks one of ``limits`` (the server's
    defaults when None)."""
    limits = limits or ConstraintLimits()
    check_limits(constraint, limits)
    lltok = ll_tokenizer(tokenizer)  # built once per model, before the compile is timed
    key = (constraint, lltok)
    if _CACHE.get(key) is not None:
        return
    started_s = time.thread_time()  # the compile's own CPU: not the wait for a core
    matcher = _compile(constraint, lltok)
    took_ms = (time.thread_time() - started_s) * 1000
    if took_ms > limits.max_compile_ms:
        raise ConstraintLimitError(
            f"compiling the constraint took {took_ms:.0f} ms; this server allows "
            f"{limits.max_compile_ms:.0f} (constraints.max_compile_ms)", "max_compile_ms")
    _CACHE.put(key, matcher)


def _weight(key: tuple[Constraint, llguidance.LLTokenizer]) -> int:
    return len(key[0].spec) + CACHE_ENTRY_OVERHEAD_BYTES


_CACHE: SizedCache[tuple[Constraint, llguidance.LLTokenizer], llguidance.LLMatcher] = \
    SizedCache(CACHE_SCHEMA_BYTES, _weight)
"""Compiled grammars (callers ``deep_copy`` them), least recently used out past
``CACHE_SCHEMA_BYTES`` of constraint text."""


def _compiled(constraint: Constraint, lltok: llguidance.LLTokenizer) -> llguidance.LLMatcher:
    """The compiled matcher for ``constraint``, from the cache or compiled (and cached)."""
    key = (constraint, lltok)
    matcher = _CACHE.get(key)
    if matcher is None:
        matcher = _compile(constraint, lltok)
        _CACHE.put(key, matcher)
    return matcher


def _compile(constraint: Constraint, lltok: llguidance.LLTokenizer) -> llguidance.LLMatcher:
    grammar = grammar_text(constraint)
    matcher = llguidance.LLMatcher(lltok, grammar, log_level=0)
    if matcher.is_error():
        raise ConstraintError(_client_message(matcher.get_error()))
    return matcher


def _client_message(error: str) -> str:
    """llguidance's error, first line only (later lines dump parser state)."""
    first = error.strip().splitlines()[0] if error.strip() else "invalid grammar"
    return first[:500]


@functools.lru_cache(maxsize=8)
def _alphabet(lltok: llguidance.LLTokenizer) -> tuple[int, ...]:
    """Single-character tokens a closing search tries, most useful for closing first:
    a quote closes a string (or opens the shortest value), brackets and commas end a
    number or a container, ``0`` ``t`` ``f`` ``n`` start short values, then the rest of
    printable ASCII. (``0`` before ``,`` would extend a number forever.)"""
    order = '"}],:0tfn' + "".join(chr(c) for c in range(0x20, 0x7F))
    ids: list[int] = []
    seen: set[str] = set()
    for ch in order:
        if ch in seen:
            continue
        seen.add(ch)
        tokens = lltok.tokenize_str(ch)
        if len(tokens) == 1 and lltok.decode_bytes(tokens) == ch.encode():
            ids.append(tokens[0])
    return tuple(ids)


class GrammarState:
    """One sequence's position in its grammar: the mask for its next token, and the
    budget-aware choice of that token. Owned by the engine thread."""

    def __init__(self, matcher: llguidance.LLMatcher, lltok: llguidance.LLTokenizer,
                 eos_ids: Sequence[int]) -> None:
        self._matcher = matcher
        self._lltok = lltok
        self._eos = frozenset(eos_ids)
        self._mask = mask_words(lltok.vocab_size)
        self._plan: list[int] | None = None
        """A known way to close that fits the budget, from the current state."""

    def fork(self) -> GrammarState:
        """An independent copy (a new choice of the same prompt)."""
        twin = GrammarState(self._matcher.deep_copy(), self._lltok, tuple(self._eos))
        twin._plan = None if self._plan is None else list(self._plan)
        return twin

    @property
    def done(self) -> bool:
        """The grammar can take no more tokens (the answer is complete)."""
        return bool(self._matcher.is_stopped())

    @property
    def accepting(self) -> bool:
        return bool(self._matcher.is_accepting())

    def mask_row(self, row: np.ndarray) -> np.ndarray | None:
        """Restrict ``row`` to the tokens the grammar allows next (EOS only where it
        accepts). When they are few (at most ``SUBSET_TOKENS``) their ids are returned and
        the row is left as it is: sampling among them is the same draw, far cheaper than
        over a masked 262k row. Otherwise every other token's logit becomes -inf in place
        and None is returned."""
        self._check()
        self._matcher.unsafe_compute_mask_ptr(self._mask.ctypes.data, self._mask.nbytes)
        self._check()
        vocab = self._lltok.vocab_size
        bits = np.unpackbits(self._mask.view(np.uint8), bitorder="little")[:vocab]
        if int(bits.sum()) <= SUBSET_TOKENS:
            ids = np.flatnonzero(bits)
            if not ids.size:
                raise GrammarFailure("the grammar allows no next token")
            return ids
        apply_bitmask(row[:vocab], self._mask)
        if row.size > vocab:
            row[vocab:] = -np.inf
        return None

    def allows(self, token: int) -> bool:
        """Whether the last mask allowed ``token``."""
        return token < self._lltok.vocab_size and is_allowed(self._mask, token)

    def steer(self, token: int, tokens_left: int) -> int:
        """The token to take given the sampled ``token`` and ``tokens_left`` (counting
        this one): ``token`` itself unless the budget is near and no closing would fit
        after it, then the next token of a closing that fits."""
        if token in self._eos or tokens_left > CLOSE_HORIZON_TOKENS:
            return token
        if self._plan and token == self._plan[0]:
            return token  # the model chose the closing path itself
        if self._plan is None:
            self._plan = self.closing_path(self._matcher, tokens_left)
        after = self._matcher.deep_copy()
        if after.consume_token(token):
            # Usually the known closing still closes after one more token (more text in a
            # string, another digit): replaying it is much cheaper than a search.
            old = self._plan
            if old and len(old) <= tokens_left - 1 and _closes(after, old):
                self._plan = [token, *old]
                return token
            path = self.closing_path(after, tokens_left - 1)
            if path is not None:
                self._plan = [token, *path]
        if self._plan:
            return self._plan[0]
        return token  # no closing fits at all: the budget is below any complete answer

    def advance(self, token: int) -> None:
        """Take ``token`` (EOS ends the grammar). ``GrammarFailure`` if it cannot."""
        if token in self._eos:
            self._plan = []
            return
        if not self._matcher.consume_token(token):
            raise GrammarFailure(f"grammar refused token {token}: "
                                 f"{_client_message(self._matcher.get_error())}")
        if self._plan and self._plan[0] == token:
            self._plan.pop(0)
        else:
            self._plan = None

    def closing_path(self, matcher: llguidance.LLMatcher, limit: int) -> list[int] | None:
        """A short token sequence that takes ``matcher`` to an accepting state within
        ``limit`` tokens, or None. Depth first over forced tokens and single characters
        in ``_alphabet`` order (quotes and brackets first), so the usual JSON closing is
        found on the first descent; ``CLOSE_SEARCH_NODES`` bounds the work."""
        alphabet = _alphabet(self._lltok)
        budget = [CLOSE_SEARCH_NODES]

        def search(m: llguidance.LLMatcher, left: int) -> list[int] | None:
            if m.is_accepting():
                return []
            if left <= 0 or budget[0] <= 0:
                return None
            forced = list(m.compute_ff_tokens())
            if forced:
                if len(forced) > left:
                    return None
                budget[0] -= 1
                nxt = m.deep_copy()
                if not nxt.consume_tokens(forced):
                    return None
                rest = search(nxt, left - len(forced))
                return None if rest is None else forced + rest
            for t in alphabet:
                if budget[0] <= 0:
                    return None
                if m.validate_tokens([t]) != 1:
                    continue
                budget[0] -= 1
                nxt = m.deep_copy()
                nxt.consume_token(t)
                rest = search(nxt, left - 1)
                if rest is not None:
                    return [t, *rest]
            return None

        return search(matcher, limit)

    def _check(self) -> None:
        if self._matcher.is_error():
            raise GrammarFailure(_client_message(self._matcher.get_error()))


def warm_vocabulary(tokenizer: Tokenizer) -> None:
    """Build ``tokenizer``'s grammar vocabulary now (1-3 s for 262k tokens, once per
    process and model file), e.g. on a thread at startup, so the first constrained request
    does not pay it on the thread that checks it."""
    ll_tokenizer(tokenizer)


def _closes(matcher: llguidance.LLMatcher, path: list[int]) -> bool:
    """Whether ``path`` takes ``matcher`` (left unchanged) to an accepting state."""
    probe = matcher.deep_copy()
    return bool(probe.consume_tokens(path)) and bool(probe.is_accepting())


def start_grammar(constraint: Constraint, tokenizer: Tokenizer) -> GrammarState:
    """A fresh grammar state for one sequence (``ConstraintError`` if it cannot compile)."""
    lltok = ll_tokenizer(tokenizer)
    return GrammarState(_compiled(constraint, lltok).deep_copy(), lltok,
                        sorted(tokenizer.eos_token_ids))
