"""Prompts to tokens, within the model's context: bounds of a prompt's tokens from its
bytes (the least refuses a prompt that cannot fit before it is tokenized, the most is what
the quota reserves before tokenizing), tokenizing off the event loop, and the token limit a
request gets."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sluice.backends.base import Tokenizer
from sluice.backends.chat import ChatPrompt, chat_tokens
from sluice.server.errors import context_exceeded
from sluice.server.quota import TokenBounds

TOKENS_ADDED_PER_PIECE = 1
"""Tokens a tokenizer may add to a piece of text of its own beyond the piece's bytes (a
SentencePiece space prefix)."""
TOKENS_ADDED_PER_PROMPT = 2
"""Tokens a tokenizer may add to a whole prompt (BOS, and EOS where a model adds one)."""


def check_prompt_length(tok: Tokenizer, text: str, param: str, *,
                        whole_context: bool = False) -> None:
    """Refuse (400 ``context_length_exceeded``) a prompt whose length alone proves it cannot
    fit one sequence (``whole_context``: the model's whole context, for ``/tokenize``),
    before any tokenizing: a token stands for at most ``max_token_bytes()`` bytes, so the
    text has at least ``bytes / max_token_bytes()`` tokens. Linear in the text, cheap next to
    tokenizing it (seconds for a megabyte of special-token text on llama.cpp)."""
    most = tok.max_token_bytes()
    if most is None:
        return
    n_bytes = len(text.encode("utf-8"))
    least_tokens = -(-n_bytes // most)
    room, where = ((tok.n_ctx_per_seq * tok.n_seq_max, "in all") if whole_context
                   else (tok.n_ctx_per_seq, "per sequence"))
    if least_tokens >= room:
        raise context_exceeded(
            f"This model's context holds {room} tokens {where}; the prompt "
            f"({n_bytes} bytes) has at least {least_tokens}.", param, least_tokens, room)


def prompt_bounds(tok: Tokenizer, pieces: Sequence[str], param: str) -> TokenBounds:
    """Bounds of the tokens of ``pieces`` tokenized one by one with BOS first, from their
    bytes alone: at least ``bytes / max_token_bytes()`` (a token stands for at most that
    many), at most one per byte (a token stands for at least one) plus what a tokenizer
    adds (``TOKENS_ADDED_PER_PIECE``, ``TOKENS_ADDED_PER_PROMPT``), and never more than one
    sequence holds (a longer prompt is refused once tokenized). A prompt whose least already
    cannot fit is refused here (``check_prompt_length``). May build the token table: call it
    off the event loop."""
    text = "".join(pieces)
    check_prompt_length(tok, text, param)
    n_bytes = len(text.encode("utf-8"))
    longest = tok.max_token_bytes()
    least = 0 if longest is None else -(-n_bytes // longest)
    most = n_bytes + TOKENS_ADDED_PER_PIECE * len(pieces) + TOKENS_ADDED_PER_PROMPT
    return TokenBounds(least, min(most, tok.n_ctx_per_seq))


async def text_bounds(tok: Tokenizer, text: str, param: str) -> TokenBounds:
    """A text prompt's ``prompt_bounds``, in a worker thread."""
    return await asyncio.to_thread(prompt_bounds, tok, [text], param)


async def mixed_bounds(tok: Tokenizer, pieces: Sequence[int | str],
                       param: str) -> TokenBounds:
    """A mixed prompt's ``prompt_bounds``: its texts' bounds plus one token per id (at most
    one sequence), in a worker thread."""
    texts = [p for p in pieces if isinstance(p, str)]
    n_ids = len(pieces) - len(texts)
    text = await asyncio.to_thread(prompt_bounds, tok, texts, param)
    return TokenBounds(text.least_tokens + n_ids,
                       min(text.most_tokens + n_ids, tok.n_ctx_per_seq))


def mixed_tokens(tok: Tokenizer, pieces: Sequence[int | str], *, bos: bool,
                 special: bool) -> list[int]:
    """Token ids and texts in order, each text tokenized where it stands, after BOS (when
    ``bos`` and the model adds one); the caller checked the ids."""
    ids = tok.tokenize("", add_bos=True) if bos else []
    for piece in pieces:
        ids.extend([piece] if isinstance(piece, int)
                   else tok.tokenize(piece, add_bos=False, special=special))
    return ids


async def tokenize_mixed(tok: Tokenizer, pieces: Sequence[int | str], *, bos: bool,
                         special: bool) -> list[int]:
    """``mixed_tokens`` in a worker thread, its length checked first (``mixed_bounds``)."""
    return await asyncio.to_thread(mixed_tokens, tok, pieces, bos=bos, special=special)


async def chat_bounds(tok: Tokenizer, prompt: ChatPrompt, param: str) -> TokenBounds:
    """A chat prompt's ``prompt_bounds`` (each part is tokenized on its own), in a worker
    thread."""
    return await asyncio.to_thread(prompt_bounds, tok, [p.text for p in prompt.parts], param)


async def tokenize_text(tok: Tokenizer, text: str) -> list[int]:
    """A text prompt's tokens (BOS first), in a worker thread, never on the event loop;
    its length checked first (``text_bounds``)."""
    return await asyncio.to_thread(tok.tokenize, text, add_bos=True)


async def tokenize_chat(tok: Tokenizer, prompt: ChatPrompt) -> list[int]:
    """A chat prompt's tokens (user text plain), as ``tokenize_text``."""
    return await asyncio.to_thread(chat_tokens, tok, prompt)


def token_limit(tok: Tokenizer, n_prompt: int, asked: int | None, default_tokens: int,
                names: tuple[str, str], *, context_tokens: int | None = None,
                fit: bool = False) -> int:
    """The request's token limit: ``asked``, or ``default_tokens`` capped by the room left
    in one sequence (``context_tokens``: a smaller context the request asked for, such as
    Ollama's ``num_ctx``). 400 ``context_length_exceeded`` when the prompt leaves no room or
    the prompt plus ``asked`` exceeds the context (``fit``: ``asked`` is cut to the room
    instead, as Ollama's ``num_predict``); ``names``: the request's fields for the prompt and
    the limit (the error's ``param``)."""
    context = tok.n_ctx_per_seq if context_tokens is None else min(context_tokens,
                                                                   tok.n_ctx_per_seq)
    holds = (f"This model's context holds {context} tokens per sequence"
             if context == tok.n_ctx_per_seq else f"The context asked for holds {context} tokens")
    room = context - n_prompt
    if room <= 0:
        raise context_exceeded(f"{holds}; the prompt has {n_prompt}.", names[0], n_prompt,
                               context)
    if asked is None:
        return min(default_tokens, room)
    if n_prompt + asked > context:
        if fit:
            return room
        raise context_exceeded(f"{holds}; the prompt ({n_prompt}) plus {names[1]} ({asked}) "
                               f"exceeds it.", names[1], n_prompt, context)
    return asked
