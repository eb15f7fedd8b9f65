"""llama-server's ``timings`` (prompt and predicted tokens, and the time each took) and
``prompt_progress`` objects, which OpenAI's shapes, llama-server's native ones and the
Responses API's events all carry."""

from __future__ import annotations

from sluice.engine.request import PromptProgress, Request


def timings(req: Request, n_predicted: int, now_s: float) -> dict[str, float]:
    """llama-server's ``timings``: prompt tokens computed (``prompt_n``; ``cache_n`` reused)
    and the time from the start to the first token; tokens predicted and the time after the
    first (whose rate counts the decode steps, ``n - 1``: the first token comes with the
    prompt's last pass)."""
    t = req.times
    cached = req.cached_prompt_tokens
    prompt_n = len(req.prompt_tokens) - cached
    first = t.first_token_s
    prompt_ms = 0.0 if first is None or t.started_s is None else (first - t.started_s) * 1e3
    end = t.finished_s if t.finished_s is not None else now_s
    predicted_ms = 0.0 if first is None else max(0.0, end - first) * 1e3
    steps = max(0, n_predicted - 1)
    return {
        "cache_n": cached,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n * 1e3 / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": n_predicted,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / steps if steps else 0.0,
        "predicted_per_second": steps * 1e3 / predicted_ms if predicted_ms > 0 else 0.0,
    }


def progress_timings(req: Request, progress: PromptProgress) -> dict[str, float]:
    """``timings`` while the prompt is computed: the prompt tokens computed so far
    (``prompt_n``, from none at the first report) and the time since the request started,
    nothing predicted yet."""
    prompt_n = progress.processed - progress.cache
    started = req.times.started_s
    prompt_ms = 0.0 if started is None else max(0.0, progress.time_s - started) * 1e3
    return {
        "cache_n": progress.cache,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n * 1e3 / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": 0,
        "predicted_ms": 0.0,
        "predicted_per_token_ms": 0.0,
        "predicted_per_second": 0.0,
    }


def progress_object(progress: PromptProgress, req: Request | None) -> dict[str, int]:
    """llama-server's ``prompt_progress``: ``total``, ``cache`` and ``processed`` prompt
    tokens, and ``time_ms`` since the request started (whole milliseconds)."""
    started = None if req is None else req.times.started_s
    time_ms = 0 if started is None else max(0, int((progress.time_s - started) * 1e3))
    return {"total": progress.total, "cache": progress.cache,
            "processed": progress.processed, "time_ms": time_ms}
