"""The OpenAI-compatible endpoints, driven by the official ``openai`` client against a
real server on ``examples/synthetic.toml``.

The synthetic generative model is deterministic: at temperature 0 its output depends
only on the prompt, and every token's text is `` w<id>``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest

from sluice.backends.synthetic import SyntheticTokenizer
from sluice.config import Config
from tests.server.live import LiveServer, synthetic_config, wait_for

CHAT = "synth-chat"
TOKEN_RE = re.compile(r" w\d+")
MESSAGES = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "tell me about sluice gates"},
]


@pytest.fixture(scope="module")
def oai(synthetic_server: LiveServer) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{synthetic_server.url}/v1", api_key="unused",
                           max_retries=0, timeout=30.0)
    yield client
    client.close()


@pytest.fixture(scope="module")
def tok(synthetic_server: LiveServer) -> SyntheticTokenizer:
    """An independent tokenizer built from the config, to count prompt tokens."""
    spec = next(m for m in synthetic_server.config.models if m.id == CHAT).spec()
    return SyntheticTokenizer(spec)


def chat_prompt_tokens(tok: SyntheticTokenizer, messages: list[dict[str, str]]) -> int:
    return len(tok.tokenize(tok.render_chat(messages), add_bos=True))


def greedy_chat(oai: openai.OpenAI, max_tokens: int, **kwargs: object) -> str:
    resp = oai.chat.completions.create(model=CHAT, messages=MESSAGES,  # type: ignore[arg-type]
                                       temperature=0, max_tokens=max_tokens, **kwargs)
    return resp.choices[0].message.content or ""


def stream_chat(oai: openai.OpenAI, **kwargs: object) -> tuple[list[str], list[object]]:
    """Content pieces and all chunks of a streamed chat completion."""
    pieces: list[str] = []
    chunks: list[object] = []
    with oai.chat.completions.create(model=CHAT, messages=MESSAGES,  # type: ignore[call-overload]
                                     stream=True, **kwargs) as stream:
        for chunk in stream:
            chunks.append(chunk)
            for choice in chunk.choices:
                if choice.delta.content:
                    pieces.append(choice.delta.content)
    return pieces, chunks


# -- chat completions ---------------------------------------------------------------------


def test_chat_non_streaming_length_and_exact_usage(
    oai: openai.OpenAI, tok: SyntheticTokenizer
) -> None:
    resp = oai.chat.completions.create(model=CHAT, messages=MESSAGES,  # type: ignore[arg-type]
                                       temperature=0, max_tokens=7)
    assert resp.object == "chat.completion"
    assert resp.model == CHAT
    assert len(resp.choices) == 1
    choice = resp.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.role == "assistant"
    text = choice.message.content or ""
    assert "".join(TOKEN_RE.findall(text)) == text
    assert len(TOKEN_RE.findall(text)) == 7
    assert resp.usage is not None
    assert resp.usage.prompt_tokens == chat_prompt_tokens(tok, MESSAGES)
    assert resp.usage.completion_tokens == 7
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + 7


def test_chat_greedy_is_deterministic_and_prefix_stable(oai: openai.OpenAI) -> None:
    long = greedy_chat(oai, 12)
    assert greedy_chat(oai, 12) == long
    assert long.startswith(greedy_chat(oai, 5))


def test_max_completion_tokens_is_honoured(oai: openai.OpenAI) -> None:
    resp = oai.chat.completions.create(model=CHAT, messages=MESSAGES,  # type: ignore[arg-type]
                                       temperature=0, max_completion_tokens=3)
    assert resp.usage is not None and resp.usage.completion_tokens == 3
    assert resp.choices[0].finish_reason == "length"


def test_chat_streaming_concatenates_to_the_non_streaming_text(oai: openai.OpenAI) -> None:
    expected = greedy_chat(oai, 9)
    pieces, chunks = stream_chat(oai, temperature=0, max_tokens=9)
    assert "".join(pieces) == expected
    assert len(pieces) == 9
    first = chunks[0]
    assert first.object == "chat.completion.chunk"  # type: ignore[attr-defined]
    assert first.choices[0].delta.role == "assistant"  # type: ignore[attr-defined]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]  # type: ignore[attr-defined]
    assert finishes[-1] == "length"
    assert all(f is None for f in finishes[:-1])
    # Without stream_options no chunk carries usage.
    assert all(getattr(c, "usage", None) is None for c in chunks)
    ids = {c.id for c in chunks}  # type: ignore[attr-defined]
    assert len(ids) == 1


def test_chat_stream_include_usage_puts_usage_on_the_last_chunk(
    oai: openai.OpenAI, tok: SyntheticTokenizer
) -> None:
    pieces, chunks = stream_chat(oai, temperature=0, max_tokens=4,
                                 stream_options={"include_usage": True})
    last = chunks[-1]
    assert last.choices == []  # type: ignore[attr-defined]
    usage = last.usage  # type: ignore[attr-defined]
    assert usage is not None
    assert usage.prompt_tokens == chat_prompt_tokens(tok, MESSAGES)
    assert usage.completion_tokens == 4
    assert usage.total_tokens == usage.prompt_tokens + 4
    assert all(c.usage is None for c in chunks[:-1])  # type: ignore[attr-defined]
    assert "".join(pieces) == greedy_chat(oai, 4)


def test_stop_string_ends_with_stop_and_is_not_returned(oai: openai.OpenAI) -> None:
    greedy = greedy_chat(oai, 10)
    words = greedy.split()
    stop = words[3]  # e.g. "w467": cut before its first occurrence
    expected = greedy[: greedy.index(stop)]
    resp = oai.chat.completions.create(model=CHAT, messages=MESSAGES,  # type: ignore[arg-type]
                                       temperature=0, max_tokens=10, stop=stop)
    text = resp.choices[0].message.content or ""
    assert resp.choices[0].finish_reason == "stop"
    assert text == expected
    assert stop not in text
    assert resp.usage is not None and resp.usage.completion_tokens < 10

    pieces, chunks = stream_chat(oai, temperature=0, max_tokens=10, stop=[stop, "never-seen"])
    assert "".join(pieces) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"  # type: ignore[attr-defined]


def test_stop_string_that_never_occurs_runs_to_length(oai: openai.OpenAI) -> None:
    resp = oai.chat.completions.create(model=CHAT, messages=MESSAGES,  # type: ignore[arg-type]
                                       temperature=0, max_tokens=6, stop=["zzz"])
    assert resp.choices[0].finish_reason == "length"
    assert resp.choices[0].message.content == greedy_chat(oai, 6)


def test_sampling_with_a_seed_is_reproducible(oai: openai.OpenAI) -> None:
    def sample() -> str:
        resp = oai.chat.completions.create(model=CHAT, messages=MESSAGES,  # type: ignore[arg-type]
                                           temperature=1.5, top_p=0.9, seed=1234, max_tokens=8)
        return resp.choices[0].message.content or ""

    assert sample() == sample()


# -- completions --------------------------------------------------------------------------


def test_completions_non_streaming_and_streaming(
    oai: openai.OpenAI, tok: SyntheticTokenizer
) -> None:
    prompt = "the quick brown fox"
    resp = oai.completions.create(model=CHAT, prompt=prompt, temperature=0, max_tokens=5)
    assert resp.object == "text_completion"
    text = resp.choices[0].text
    assert resp.choices[0].finish_reason == "length"
    assert len(TOKEN_RE.findall(text)) == 5
    assert resp.usage is not None
    assert resp.usage.prompt_tokens == len(tok.tokenize(prompt, add_bos=True)) == 5
    assert resp.usage.completion_tokens == 5

    pieces: list[str] = []
    last = None
    with oai.completions.create(model=CHAT, prompt=prompt, temperature=0, max_tokens=5,
                                stream=True, stream_options={"include_usage": True}) as stream:
        for chunk in stream:
            pieces.extend(c.text for c in chunk.choices)
            last = chunk
    assert "".join(pieces) == text
    assert last is not None and last.usage is not None
    assert last.usage.completion_tokens == 5
    assert last.usage.prompt_tokens == 5


def test_completions_default_max_tokens_is_16(oai: openai.OpenAI) -> None:
    resp = oai.completions.create(model=CHAT, prompt="hello", temperature=0)
    assert resp.usage is not None and resp.usage.completion_tokens == 16
    assert resp.choices[0].finish_reason == "length"


def test_completions_accept_token_ids(oai: openai.OpenAI) -> None:
    resp = oai.completions.create(model=CHAT, prompt=[5, 6, 7, 8], temperature=0, max_tokens=3)
    assert resp.usage is not None
    assert resp.usage.prompt_tokens == 4  # ids are taken as given: no BOS added
    assert resp.usage.completion_tokens == 3


def test_completion_text_round_trips_as_prompt(oai: openai.OpenAI) -> None:
    """Generated `` w<id>`` text tokenizes back to those ids, so text and ids agree."""
    ids = [17, 42, 99]
    by_ids = oai.completions.create(model=CHAT, prompt=[1, *ids], temperature=0, max_tokens=4)
    by_text = oai.completions.create(model=CHAT, prompt=" w17 w42 w99", temperature=0,
                                     max_tokens=4)
    assert by_ids.choices[0].text == by_text.choices[0].text


# -- embeddings ---------------------------------------------------------------------------


def test_embeddings_float_and_base64_agree(oai: openai.OpenAI) -> None:
    inputs = ["alpha", "beta", "gamma"]
    as_float = oai.embeddings.create(model="synth-a", input=inputs, encoding_format="float")
    assert as_float.object == "list"
    assert as_float.model == "synth-a"
    assert [d.index for d in as_float.data] == [0, 1, 2]
    vectors = [d.embedding for d in as_float.data]
    assert all(len(v) == 16 for v in vectors)  # dim = 16 in examples/synthetic.toml
    for v in vectors:
        assert math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-5)
    assert vectors[0] != vectors[1] != vectors[2]
    assert as_float.usage.prompt_tokens == 3 * 2  # BOS and the word, as the model reads it

    # The client's default asks for base64 and decodes it: the same float32 values.
    default = oai.embeddings.create(model="synth-a", input=inputs)
    for got, want in zip((d.embedding for d in default.data), vectors, strict=True):
        assert len(got) == 16
        assert got == pytest.approx(want, rel=1e-6, abs=1e-7)


def test_embeddings_base64_on_the_wire(synthetic_server: LiveServer) -> None:
    import base64

    import numpy as np

    with synthetic_server.client() as c:
        plain = c.post("/v1/embeddings", json={"model": "synth-a", "input": "x"}).json()
        b64 = c.post("/v1/embeddings", json={"model": "synth-a", "input": "x",
                                             "encoding_format": "base64"}).json()
    raw = b64["data"][0]["embedding"]
    assert isinstance(raw, str)
    decoded = np.frombuffer(base64.b64decode(raw), dtype="<f4")
    assert decoded.shape == (16,)
    assert decoded.tolist() == pytest.approx(plain["data"][0]["embedding"], abs=1e-7)


def test_embedding_usage_counts_the_tokens_the_model_read(
    oai: openai.OpenAI, synthetic_server: LiveServer
) -> None:
    spec = next(m for m in synthetic_server.config.models if m.id == "synth-a").spec()
    embed_tok = SyntheticTokenizer(spec)
    inputs = ["the meaning of life", "is 42"]
    counts = [len(embed_tok.tokenize(t, add_bos=True)) for t in inputs]
    assert counts == [5, 3]  # BOS included: not the whitespace word count
    one = oai.embeddings.create(model="synth-a", input=inputs[0])
    assert one.usage.prompt_tokens == one.usage.total_tokens == counts[0]
    both = oai.embeddings.create(model="synth-a", input=inputs)
    assert both.usage.prompt_tokens == both.usage.total_tokens == sum(counts)


def test_embedding_is_a_pure_function_of_the_input(oai: openai.OpenAI) -> None:
    one = oai.embeddings.create(model="synth-a", input="same", encoding_format="float")
    two = oai.embeddings.create(model="synth-a", input=["other", "same"],
                                encoding_format="float")
    assert two.data[1].embedding == one.data[0].embedding


def test_embedding_inputs_of_token_ids(oai: openai.OpenAI,
                                       synthetic_server: LiveServer) -> None:
    """OpenAI's token-id inputs (``list[int]``, ``list[list[int]]``) and llama-server's
    mixed prompts (ids and texts in one list: one prompt) embed one vector per prompt, and
    usage counts each id as one token; a text-only prompt given as a list embeds as its
    text does."""
    one = oai.embeddings.create(model="synth-a", input=[12, 34, 56], encoding_format="float")
    assert len(one.data) == 1 and one.usage.prompt_tokens == 3
    many = oai.embeddings.create(model="synth-a", input=[[12, 34, 56], [7, 8]],
                                 encoding_format="float")
    assert [d.index for d in many.data] == [0, 1]
    assert many.data[0].embedding == one.data[0].embedding
    assert many.data[1].embedding != one.data[0].embedding
    assert many.usage.prompt_tokens == 5
    with synthetic_server.client() as c:
        mixed = c.post("/v1/embeddings", json={"model": "synth-a",
                                               "input": [12, 34, "is 42", 56]})
        assert mixed.status_code == 200, mixed.text
        assert len(mixed.json()["data"]) == 1
        assert mixed.json()["usage"]["prompt_tokens"] == 3 + 2  # 3 ids and "is 42"
        nested = c.post("/v1/embeddings", json={"model": "synth-a",
                                                "input": ["same", [12, "x"]]}).json()
        plain = c.post("/v1/embeddings", json={"model": "synth-a", "input": "same"}).json()
        assert len(nested["data"]) == 2
        assert nested["data"][0]["embedding"] == plain["data"][0]["embedding"]


@pytest.mark.parametrize("bad", [[12, [34]], [], [True, 2], [[1], None], {"a": 1}])
def test_a_malformed_embedding_input_is_a_400_and_the_server_serves(
        synthetic_server: LiveServer, bad: object) -> None:
    with synthetic_server.client() as c:
        r = c.post("/v1/embeddings", json={"model": "synth-a", "input": bad})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "invalid_request_error"
        ok = c.post("/v1/embeddings", json={"model": "synth-a", "input": [1, 2]})
        assert ok.status_code == 200, ok.text


# -- models -------------------------------------------------------------------------------


def test_models_list(oai: openai.OpenAI) -> None:
    models = oai.models.list()
    ids = [m.id for m in models]
    assert ids == ["synth-a", "synth-b", "synth-chat"]
    for m in models:
        assert m.object == "model"
        assert m.owned_by == "sluice"
    kinds = {m.id: (m.model_extra or {}).get("kind") for m in models}
    assert kinds == {"synth-a": "oneshot", "synth-b": "oneshot", "synth-chat": "generative"}


def test_resident_flag_flips_after_use(serve: Callable[[Config], LiveServer]) -> None:
    live = serve(synthetic_config())

    def models(c: httpx.Client) -> dict[str, dict[str, object]]:
        return {m["id"]: m for m in c.get("/v1/models").json()["data"]}

    with live.client() as c:
        before = models(c)
        # the default model (synth-chat) is loaded at start-up; the others on demand
        assert {k: v["resident"] for k, v in before.items()} == {
            "synth-a": False, "synth-b": False, "synth-chat": True}
        assert all(v["status"] == "available" for v in before.values())
        r = c.post("/v1/embeddings", json={"model": "synth-a", "input": "hi"})
        assert r.status_code == 200
        after = models(c)
        assert after["synth-a"]["resident"] is True
        assert after["synth-a"]["resident_on"] == [int(r.headers["x-sluice-worker"])]
        assert after["synth-b"]["resident"] is False
        r = c.post("/v1/infer", json={"model": "synth-b", "input": "x"})
        assert r.status_code == 200
        wait_for(lambda: models(c)["synth-b"]["resident"])
