"""A new user's first chat: ``sluice serve`` with no file or flag (the packaged default,
SmolLM2-135M-Instruct, with its own ChatML template), plain factual questions through the
openai SDK with greedy decoding, and the answer must name the expected word; then the
same through ``sluice chat``. Gemma 3 270M is served beside it as a completion model."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import httpx
import openai
import pytest

from sluice.engine.sampling_defaults import LLAMA_SERVER_DEFAULTS
from tests.procs import free_port, start_serve
from tests.test_cli import sluice

pytestmark = pytest.mark.llm
pytest.importorskip("llama_cpp", reason="the llm extra is not installed")

DEFAULT = "smollm2-135m-instruct"
GEMMA = "gemma-3-270m"
QUESTIONS = [
    ("What is the capital of France? Answer in one word.", ("paris",)),
    ("How many legs does a spider have?", ("8", "eight")),
    ("What is the opposite of hot?", ("cold",)),
    ("What language is spoken in Spain?", ("spanish",)),
    ("What is the chemical symbol for water?", ("h2o",)),
]
"""Each question and the words one of which a right answer names (lower case)."""


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    port = free_port()
    proc = start_serve(None, port, timeout_s=100)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        assert proc.stdout is not None
        proc.stdout.close()


def test_the_default_model_answers_plain_questions(base: str) -> None:
    with openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0,
                       timeout=100) as oai:
        for question, words in QUESTIONS:
            r = oai.chat.completions.create(
                model=DEFAULT, messages=[{"role": "user", "content": question}],
                max_tokens=24, temperature=0)
            answer = (r.choices[0].message.content or "").lower()
            assert any(w in answer for w in words), (question, answer)


def test_both_packaged_models_are_listed_with_their_kind(base: str) -> None:
    models = {m["id"]: m for m in httpx.get(f"{base}/v1/models", timeout=60).json()["data"]}
    assert list(models) == [DEFAULT, GEMMA]
    assert models[DEFAULT]["capabilities"] == ["completion", "chat"]
    assert models[DEFAULT]["chat_template"] == "jinja"  # the GGUF's own template
    assert models[GEMMA]["capabilities"] == ["completion"]  # a base model: no template
    # neither GGUF recommends sampling, and no [models.sampling] is configured
    for entry in models.values():
        assert entry["sampling_defaults"] == LLAMA_SERVER_DEFAULTS
        assert set(entry["sampling_defaults_from"].values()) == {"llama-server"}


def test_chat_to_gemma_is_refused_and_its_completions_are_served(base: str) -> None:
    with openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0,
                       timeout=100) as oai:
        with pytest.raises(openai.BadRequestError) as refused:
            oai.chat.completions.create(model=GEMMA, max_tokens=4,
                                        messages=[{"role": "user", "content": "Hi"}])
        assert refused.value.code == "model_has_no_chat_template"
        done = oai.completions.create(model=GEMMA, prompt="The capital of France is the city of",
                                      max_tokens=3, temperature=0)
        assert "Paris" in done.choices[0].text


def test_sluice_chat_names_paris() -> None:
    """Greedy, as the server's test asks: to the bare question SmolLM2 (135M, Q4_1) answers
    in French, about the Étoile; asked for one word it names Paris."""
    try:
        out = sluice("chat", "--temperature", "0", "--max-tokens", "24",
                     QUESTIONS[0][0], timeout=110)
    except subprocess.TimeoutExpired:
        pytest.fail("sluice chat did not answer within 110 s")
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout, out.stdout
