"""A deterministic backend with a cost model: no model file, same protocol as the real ones.

Service times come from the spec's ``options`` (all seconds, multiplied by ``speed_scale``):
``load_s``; one-shot ``batch_fixed_s`` + ``per_item_s`` × items; generative ``step_fixed_s``
+ ``decode_per_seq_s`` × decoding sequences + ``prefill_per_token_s`` × prompt tokens in the
pass. Outputs are pure functions of the inputs (a ``rerank`` model's score is
``word_overlap``). Faults: ``fail_load`` (every load raises), ``fail_on_calls`` (the listed
1-based ``run_batch``/``forward`` calls raise) and ``nan_logits_after_token`` (the logits
row after that token id is all NaN: one sequence's distribution breaks, not the pass), for
tests. ``byte_tokens`` makes ids 3..258 the 256 single bytes, so grammars over text (JSON)
can be decoded; ``all_logits`` chunks get a row per position. With ``byte_tokens``,
``reply`` is a text the model writes byte by byte after any prompt, then EOS (a scripted
answer: a model that thinks in tags, for instance). ``markov_order`` (an integer k) makes
the next token a hash of the last k tokens alone (no position): text that repeats itself, so
n-gram drafts are accepted often but not always (speculation tests). Drafted tokens
(``ForwardChunk.draft_tokens``) cost and count as decodes, and get the rows any token at
their position would. ``chat_template`` (a Jinja source) renders chats in place of the
``role: content`` turns, as a GGUF's own template would (a load error if it does not
compile).

Modules: ``cost`` (``CostModel``: service times and injected faults from the options;
``digest``, the hash outputs derive from), ``tokenizer`` (``SyntheticTokenizer``,
``SPECIAL_TOKENS``), ``oneshot`` (``SyntheticOneShot``, ``word_overlap``), ``generative``
(``SyntheticGenerative``, ``SEQUENCE_FILE``), ``backend`` (``SyntheticBackend``).
"""

from sluice.backends.synthetic.backend import SyntheticBackend
from sluice.backends.synthetic.generative import SyntheticGenerative
from sluice.backends.synthetic.oneshot import SyntheticOneShot
from sluice.backends.synthetic.tokenizer import SyntheticTokenizer

__all__ = ["SyntheticBackend", "SyntheticGenerative", "SyntheticOneShot", "SyntheticTokenizer"]
