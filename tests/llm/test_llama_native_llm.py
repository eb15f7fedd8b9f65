"""llama-server's native endpoints on the packaged SmolLM2-135M-Instruct (llama.cpp): a
``/completion`` answers the fact, streamed and not alike, with its probabilities; the
prompt ``/apply-template`` renders runs as a chat request does (same tokens, same greedy
answer); ``post_sampling_probs`` report the sampler chain's distribution and change no
draw; ``/props`` and ``/slots`` describe the loaded model; ``/infill`` is refused (the
GGUF has no FIM tokens) and the server serves on."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from sluice.config import Config
from tests.server.live import LiveServer, start_server

pytestmark = pytest.mark.llm
pytest.importorskip("llama_cpp", reason="the llm extra is not installed")

MODEL = "smollm2-135m-instruct"
FACT = {"prompt": "The capital of France is", "n_predict": 8, "temperature": 0}


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    config = Config.model_validate({
        "models": [{"id": MODEL, "kind": "generative", "backend": "llamacpp",
                    "task": "generation", "memory_bytes": 600_000_000,
                    "options": {"path": f"packaged:{MODEL}", "n_ctx": 2048, "n_seq_max": 2,
                                "n_threads": 2}}],
        "workers": {"count": 1, "budget_bytes": 2_000_000_000},
    })
    server = start_server(config)
    yield server
    server.stop()


def test_completion_plain_and_streamed(live: LiveServer) -> None:
    with live.client(timeout=120) as c:
        body = c.post("/completion", json={**FACT, "n_probs": 3}).json()
        n_prompt = len(c.post("/tokenize", json={"content": FACT["prompt"],
                                                 "add_special": True}).json()["tokens"])
        with c.stream("POST", "/completion", json={**FACT, "stream": True}) as r:
            chunks = [json.loads(line[len("data: "):]) for line in r.iter_lines() if line]
    assert "Paris" in body["content"] and body["model"] == MODEL
    assert body["tokens_evaluated"] == n_prompt == body["timings"]["prompt_n"]
    assert body["tokens_predicted"] == body["timings"]["predicted_n"] == 8
    assert body["stop_type"] == "limit" and body["timings"]["predicted_per_second"] > 0
    probs = body["completion_probabilities"]
    assert len(probs) == 8
    for p in probs:  # greedy: each token is the most likely of its alternatives
        assert p["logprob"] <= 0 and len(p["top_logprobs"]) == 3
        assert p["id"] == p["top_logprobs"][0]["id"]
    assert probs[0]["token"] == " Paris"
    *tokens, last = chunks
    assert all(not t["stop"] and len(t["tokens"]) == 1 for t in tokens)
    assert last["stop"] is True and last["tokens_predicted"] == 8
    assert "".join(t["content"] for t in chunks) == body["content"]


def test_post_sampling_probs_report_the_chain_and_change_no_draw(live: LiveServer) -> None:
    """Sampled with ``top_k`` 10 (no top-p, no min-p): each token's ``top_probs`` are the
    ten kept candidates, summing to 1, and asking for them draws the same tokens."""
    sampled = {"prompt": FACT["prompt"], "n_predict": 6, "temperature": 1.0, "top_k": 10,
               "top_p": 1.0, "min_p": 0.0, "seed": 7, "return_tokens": True}
    with live.client(timeout=120) as c:
        plain = c.post("/completion", json=sampled).json()
        post = c.post("/completion", json={**sampled, "n_probs": 10,
                                           "post_sampling_probs": True}).json()
    assert post["tokens"] == plain["tokens"] and post["content"] == plain["content"]
    probs = post["completion_probabilities"]
    assert [p["id"] for p in probs] == post["tokens"]
    for p in probs:
        top = {t["id"]: t["prob"] for t in p["top_probs"]}
        assert len(top) == 10 and sum(top.values()) == pytest.approx(1.0, abs=1e-5)
        assert p["prob"] == top[p["id"]] and 0.0 < p["prob"] <= 1.0


def test_apply_template_prompt_runs_as_the_chat_request(live: LiveServer) -> None:
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one "
                                            "word."}]
    with live.client(timeout=120) as c:
        prompt = c.post("/apply-template", json={"messages": messages}).json()["prompt"]
        assert prompt.startswith("<|im_start|>system\n")
        assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")
        native = c.post("/completion", json={"prompt": prompt, "n_predict": 16,
                                              "temperature": 0}).json()
        chat = c.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 16,
                                                    "temperature": 0}).json()
    assert native["tokens_evaluated"] == chat["usage"]["prompt_tokens"]
    assert native["content"] == chat["choices"][0]["message"]["content"]
    assert "Paris" in native["content"] and native["stop_type"] == "eos"


def test_props_slots_and_infill_on_the_real_model(live: LiveServer) -> None:
    with live.client(timeout=120) as c:
        props = c.get("/props").json()
        assert props["total_slots"] == 2 and props["model_alias"] == MODEL
        assert props["default_generation_settings"]["n_ctx"] == 1024
        assert props["model_path"] == f"packaged:{MODEL}"
        assert props["chat_template"] == "jinja"
        r = c.post("/infill", json={"input_prefix": "def add(a, b):\n    return ",
                                    "input_suffix": "\n"})
        assert r.status_code == 501
        assert r.json()["error"]["type"] == "not_supported_error"
        long = {**FACT, "prompt": "Here are the countries of Europe and their capital "
                                  "cities, one a line. " + str(FACT["prompt"])}
        for slot in c.get("/slots").json():  # what earlier requests left
            assert c.post(f"/slots/{slot['id']}?action=erase").status_code == 200
        first = c.post("/completion", json=long).json()
        [kept] = [s for s in c.get("/slots").json() if s["n_prompt_tokens"] > 0]
        assert kept["is_processing"] is False
        assert kept["n_prompt_tokens"] >= first["tokens_evaluated"]
        assert c.post("/completion", json=long).json()["timings"]["cache_n"] > 0
        # the repeat copied the prompt out of the first's slot, which kept its KV: both kept
        kept_slots = [s for s in c.get("/slots").json() if s["n_prompt_tokens"] > 0]
        assert len(kept_slots) == 2
        for kept in kept_slots:
            r = c.post(f"/slots/{kept['id']}?action=erase").json()
            assert r == {"id_slot": kept["id"], "n_erased": kept["n_prompt_tokens"]}
        again = c.post("/completion", json=long).json()
        assert again["timings"]["cache_n"] == 0 and again["content"] == first["content"]
