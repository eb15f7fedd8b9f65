"""A measured step-time prior: a short warm-up of real forward passes when a generative
model loads, fitted to the step-time model (``sluice.policy.step.step_cost``), so that the
TPOT budget and the first-token predictor are right from the first request on this host
instead of starting from a rough default and learning for the first few seconds.

What it runs (slots 0 .. B-1, every one released afterwards): one throwaway token (the
first pass pays one-time allocation), one prompt of ``PROMPT_TOKENS`` tokens alone (the
per-prompt-token cost, as a server prefills: a prompt or two at a time; twice), then
``STEPS_PER_BATCH`` one-token steps of every slot at each batch size of
``warmup_batches`` (the base and per-sequence cost); the fit takes each pass's fastest
repeat, so a burst of another process during the warm-up does not inflate the prior.
For the packaged Gemma 3 270M on 2 cores with 32 slots that is about 1 s of its load.

It measures bare forward passes; the online model then learns the whole inter-token cycle
(the engine's and the server's work between steps) from the steps that run.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sluice.backends.base import ForwardChunk, GenerativeModel
from sluice.policy.step.step_cost import StepCost, StepSample, fit_step_cost

PROMPT_TOKENS = 64
STEPS_PER_BATCH = 3


def warmup_batches(n_seq_max: int) -> tuple[int, ...]:
    """The batch sizes warmed up: 1, a quarter, a half and all of the slots (distinct)."""
    n = max(1, n_seq_max)
    return tuple(sorted({1, max(1, n // 4), max(1, n // 2), n}))


def measure_step_cost(model: GenerativeModel, fallback: StepCost,
                      clock: Callable[[], float] = time.perf_counter) -> StepCost:
    """Fit a ``StepCost`` to a warm-up of real steps on ``model`` (see the module), every
    coefficient >= 0 (``fallback`` only for a term the steps leave undetermined); the
    context term is 0: these short steps cannot separate it from the per-sequence one.
    Leaves every slot it used empty. Raises what ``forward`` raises."""
    batches = warmup_batches(model.n_seq_max)
    width = batches[-1]
    vocab = model.vocab_size
    prompt = tuple(1 + i % (vocab - 1) for i in range(PROMPT_TOKENS))
    samples: list[StepSample] = []
    try:
        model.forward([ForwardChunk(0, prompt[:1], 0, True)])  # one-time costs
        model.release_sequence(0)
        prefill_s = []
        for s in range(min(2, width)):
            t = clock()
            model.forward([ForwardChunk(s, prompt, 0, True)])
            prefill_s.append(clock() - t)
        samples.append(StepSample(0, PROMPT_TOKENS, min(prefill_s)))
        length = [PROMPT_TOKENS] * len(prefill_s) + [0] * (width - len(prefill_s))
        for batch in batches:
            step_s = []
            for _ in range(STEPS_PER_BATCH):
                chunks = [ForwardChunk(s, prompt[-1:], length[s], True) for s in range(batch)]
                t = clock()
                model.forward(chunks)
                step_s.append(clock() - t)
                for s in range(batch):
                    length[s] += 1
            # the fastest of the same pass: another process's burst only slows one down
            samples.append(StepSample(batch, 0, min(step_s)))
    finally:
        for s in range(width):
            model.release_sequence(s)
    return fit_step_cost(samples, with_context=False, fallback=fallback)
