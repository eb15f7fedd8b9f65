"""Applying a grammar engine's token bitmask (32 tokens per int32 word, bit ``t % 32`` of
word ``t // 32``, llguidance's and xgrammar's layout) to a logits row."""

from __future__ import annotations

import numpy as np


def mask_words(vocab_size: int) -> np.ndarray:
    """A zeroed bitmask for ``vocab_size`` tokens."""
    return np.zeros((vocab_size + 31) // 32, dtype=np.int32)


def allowed(mask: np.ndarray, vocab_size: int) -> np.ndarray:
    """The mask as one bool per token."""
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")
    return bits[:vocab_size].view(np.bool_)


def apply_bitmask(row: np.ndarray, mask: np.ndarray) -> None:
    """Set the logit of every token the mask forbids to -inf, in place."""
    np.putmask(row, ~allowed(mask, row.size), -np.inf)


def is_allowed(mask: np.ndarray, token: int) -> bool:
    """Whether the mask allows ``token``."""
    return bool((int(mask[token >> 5]) >> (token & 31)) & 1)
