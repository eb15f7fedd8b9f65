"""Prompt progress (llama-server's ``return_progress``) comes from the engine: one report when
a request starts, then one after every forward pass that feeds its prompt, all before its
first token; only for a request that asks."""

from __future__ import annotations

from sluice.engine.request import Event, PromptProgress, Request, TokenEvent
from tests.engine.test_continuous import engine, request, run_to_idle


def _listen(req: Request) -> list[Event]:
    seen: list[Event] = []
    req.listeners.append(seen.append)
    return seen


def _progress(events: list[Event]) -> list[tuple[int, int, int]]:
    return [(e.total, e.cache, e.processed) for e in events if isinstance(e, PromptProgress)]


def test_every_prefill_pass_is_reported_before_the_first_token() -> None:
    eng, _ = engine(prefill_chunk_tokens=8, max_batch_tokens=8)
    req = request(n_prompt=20, max_tokens=3)
    req.report_progress = True
    seen = _listen(req)
    eng.add(req)
    run_to_idle(eng)
    assert _progress(seen) == [(20, 0, 0), (20, 0, 8), (20, 0, 16), (20, 0, 20)]
    first_token = next(i for i, e in enumerate(seen) if isinstance(e, TokenEvent))
    assert all(isinstance(e, PromptProgress) for e in seen[:first_token])
    assert sum(isinstance(e, TokenEvent) for e in seen) == 3
    times = [e.time_s for e in seen if isinstance(e, PromptProgress)]
    assert times == sorted(times)


def test_a_reused_prefix_is_the_cache_of_the_first_report() -> None:
    eng, _ = engine(prefill_chunk_tokens=64, retain_prefixes=True, min_prefix_tokens=8)
    first = request(n_prompt=30, max_tokens=2)
    eng.add(first)
    run_to_idle(eng)
    again = Request(request_id=first.request_id + 1000, model_id="chat", kind="generative",
                    arrival_s=0.0, prompt_tokens=first.prompt_tokens, params=first.params,
                    report_progress=True)
    again.mark_queued(0.0)
    seen = _listen(again)
    eng.add(again)
    run_to_idle(eng)
    reports = _progress(seen)
    total, cache, processed = reports[0]
    assert total == 30 and 0 < cache < 30 and processed == cache
    assert reports[-1] == (30, cache, 30) and len(reports) == 2
    assert again.cached_prompt_tokens == cache


def test_no_report_unless_asked() -> None:
    eng, _ = engine(prefill_chunk_tokens=8, max_batch_tokens=8)
    req = request(n_prompt=20, max_tokens=2)
    seen = _listen(req)
    eng.add(req)
    run_to_idle(eng)
    assert _progress(seen) == [] and len(seen) == 3  # two tokens and the final
