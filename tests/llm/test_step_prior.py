"""The packaged model's measured step-time prior (``step_cost_warmup``, on in the default
config) against the real model: an idle engine's predicted first-token time and a decode
step's predicted time are close to what the model then takes (a wide band: this checks
that the prediction is of the right thing, not the host's speed)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sluice.backends.base import ForwardChunk, ModelSpec
from sluice.backends.llamacpp import LlamaCppBackend, LlamaCppGenerative
from sluice.config import default_config
from sluice.engine.continuous import ContinuousEngine, EngineConfig
from sluice.engine.request import Request, SamplingParams

pytestmark = pytest.mark.llm
pytest.importorskip("llama_cpp", reason="the llm extra is not installed")

BAND = 3.0
"""Predicted / measured must lie within [1/BAND, BAND]: the old prediction of an idle
engine's first token (a prefill plus a decode step of every slot) was about 5x off. Both
sides take the fastest of their repeats (as the warm-up does), so another process's burst
on a shared host moves neither, and each prediction is measured beside what it predicts."""


def test_the_default_model_measures_its_prior() -> None:
    for model in default_config().models:
        assert model.spec().step_cost_warmup and model.spec().step_cost_path is None


@pytest.fixture(scope="module")
def engine() -> Iterator[ContinuousEngine]:
    spec = ModelSpec("g", "generative", "llamacpp", 600_000_000, tpot_target_s=0.150,
                     step_cost_warmup=True,
                     options={"path": "packaged:gemma-3-270m", "n_ctx": 8 * 256,
                              "n_seq_max": 8, "n_threads": 2})
    model = LlamaCppBackend().load(spec)
    assert isinstance(model, LlamaCppGenerative)
    eng = ContinuousEngine(model, EngineConfig(), time.monotonic, lambda r: None)
    assert model.slot_len == [0] * 8  # the warm-up left every slot empty
    yield eng
    model.close()


def _within_band(predicted: float, measured: float) -> bool:
    return measured / BAND <= predicted <= measured * BAND


def test_an_idle_engines_first_token_is_predicted_close(engine: ContinuousEngine) -> None:
    """Each repeat builds a fresh engine on the same model, so its prior is measured right
    before the first token it predicts: a host that slows down between the fixture's
    warm-up and this test slows both sides alike."""
    prompt = tuple(engine.model.tokenize(
        "Write a short story about a lighthouse keeper who finds a message.", add_bos=True))
    predicted, measured = [], []
    for i in range(3):
        fresh = ContinuousEngine(engine.model, EngineConfig(), time.monotonic, lambda r: None)
        predicted.append(fresh.predict_ttft(len(prompt)).ttft_s)
        req = Request(request_id=i + 1, model_id="g", kind="generative",
                      arrival_s=time.monotonic(), prompt_tokens=prompt,
                      params=SamplingParams(max_tokens=2, temperature=0.0))
        req.mark_queued(req.arrival_s)
        fresh.add(req)
        while req.times.first_token_s is None:
            assert fresh.step()
        measured.append(req.times.first_token_s - req.arrival_s)
        while fresh.has_work:
            fresh.step()
    assert _within_band(min(predicted), min(measured)), (predicted, measured)


def test_a_decode_step_is_predicted_close(engine: ContinuousEngine) -> None:
    model = engine.model
    prior = engine.step_cost.current()
    batch = 4
    model.forward([ForwardChunk(s, (2, 3, 4, 5), 0, True) for s in range(batch)])
    seconds = []
    for i in range(5):
        t = time.perf_counter()
        model.forward([ForwardChunk(s, (6,), 4 + i, True) for s in range(batch)])
        seconds.append(time.perf_counter() - t)
    for s in range(batch):
        model.release_sequence(s)
    predicted = prior.predict_s(batch, 0, batch * 6)
    assert _within_band(predicted, min(seconds)), (predicted, seconds)
