"""The metric names other servers' tooling reads, from the same state as sluice's own.

- ``vllm:*``: what the Gateway API Inference Extension's endpoint picker scrapes to route
  among the pods of an InferencePool (its model server protocol): requests waiting and
  running, KV-cache use (0-1), and the KV block size and count as labels of
  ``vllm:cache_config_info``. The values are pod-wide (every model on every worker) and carry
  no labels, so the picker needs no per-model label selection. ``vllm:gpu_cache_usage_perc``
  is the same value under the name older pickers read.
- ``llamacpp:*``: llama-server's ``/metrics`` names (its counters and gauges), so dashboards
  and alerts written for llama-server keep working.

``vllm:num_requests_waiting`` equals ``sluice_requests_waiting`` and
``vllm:num_requests_running`` equals ``sluice_requests_running`` at the same scrape.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluice.engine.request import Request, RequestStatus
from sluice.engine.runtime import RuntimeSnapshot


def requests_waiting(snap: RuntimeSnapshot) -> int:
    """Admitted and not yet running: the global queue, the worker inboxes and requests
    waiting in an engine for KV blocks."""
    return snap.queue_depth + sum(snap.inbox_depths)


def requests_running(snap: RuntimeSnapshot) -> int:
    """Executing on a worker (every model)."""
    return sum(w.active_count for w in snap.workers)


def kv_blocks(snap: RuntimeSnapshot) -> tuple[int, int]:
    """(blocks in use, blocks in all) over every resident generative model."""
    used = total = 0
    for state in snap.workers:
        for m in state.models:
            if m.kv_total_blocks:
                total += m.kv_total_blocks
                used += m.kv_total_blocks - (m.kv_free_blocks or 0)
    return used, total


@dataclass(slots=True)
class LlamaTotals:
    """llama-server's counters, cumulative since the server started."""

    prompt_tokens: int = 0
    """Prompt tokens computed (reused prefix tokens excluded)."""
    prompt_tokens_cached: int = 0
    prompt_s: float = 0.0
    """Start of execution to first token, summed."""
    tokens_predicted: int = 0
    predicted_s: float = 0.0
    """First token to the end, summed."""
    n_decode: int = 0
    """Engine steps."""
    busy_slots: int = 0
    """Sequences over all engine steps (so ``busy_slots / n_decode`` is the mean batch)."""
    n_tokens_max: int = 0
    """Longest prompt + generation of one request."""


class LlamaTally:
    """Accumulates ``LlamaTotals`` from the observer's calls (worker threads; locked)."""

    def __init__(self, generative: Collection[str]) -> None:
        self._generative = frozenset(generative)
        self._lock = threading.Lock()
        self._totals = LlamaTotals()

    def step(self, model_id: str, size: int) -> None:
        """An engine step of ``size`` sequences (one-shot batches are not decodes)."""
        if model_id not in self._generative:
            return
        with self._lock:
            self._totals.n_decode += 1
            self._totals.busy_slots += size

    def finished(self, req: Request) -> None:
        """A completed generative request's tokens and times."""
        t = req.times
        if (req.kind != "generative" or req.status != RequestStatus.COMPLETED
                or t.started_s is None or t.finished_s is None):
            return
        final = req.final
        completion = final.completion_tokens if final else req.completion_tokens
        cached = min(req.cached_prompt_tokens, len(req.prompt_tokens))
        with self._lock:
            totals = self._totals
            totals.prompt_tokens += len(req.prompt_tokens) - cached
            totals.prompt_tokens_cached += cached
            totals.tokens_predicted += completion
            totals.n_tokens_max = max(totals.n_tokens_max, len(req.prompt_tokens) + completion)
            if t.first_token_s is not None:
                totals.prompt_s += max(0.0, t.first_token_s - t.started_s)
                totals.predicted_s += max(0.0, t.finished_s - t.first_token_s)

    def totals(self) -> LlamaTotals:
        with self._lock:
            return LlamaTotals(**{f: getattr(self._totals, f)
                                  for f in LlamaTotals.__dataclass_fields__})


class PeerMetricsCollector(Collector):
    """``vllm:*`` and ``llamacpp:*`` gauges and counters at scrape time (module docstring)."""

    def __init__(self, snapshot: Callable[[], RuntimeSnapshot], tally: LlamaTally,
                 kv_block_tokens: int) -> None:
        self._snapshot = snapshot
        self._tally = tally
        self._block_tokens = kv_block_tokens

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        waiting, running = requests_waiting(snap), requests_running(snap)
        used, total = kv_blocks(snap)
        usage = used / total if total else 0.0
        yield GaugeMetricFamily("vllm:num_requests_waiting",
                                "Requests admitted and not yet running", value=waiting)
        yield GaugeMetricFamily("vllm:num_requests_running",
                                "Requests executing on a worker", value=running)
        yield GaugeMetricFamily("vllm:kv_cache_usage_perc",
                                "KV-cache use: 1 means every block is held", value=usage)
        yield GaugeMetricFamily("vllm:gpu_cache_usage_perc",
                                "KV-cache use (the name older endpoint pickers read)",
                                value=usage)
        info = GaugeMetricFamily("vllm:cache_config_info", "KV-cache configuration (value 1)",
                                 labels=["block_size", "num_gpu_blocks"])
        info.add_metric([str(self._block_tokens), str(total)], 1)
        yield info
        yield from self._llama(self._tally.totals(), waiting, running)

    @staticmethod
    def _llama(t: LlamaTotals, waiting: int, running: int) -> Iterator[Metric]:
        counters = (
            ("prompt_tokens", "Prompt tokens processed, excluding cached tokens",
             t.prompt_tokens),
            ("prompt_tokens_cached", "Prompt tokens reused from the cache",
             t.prompt_tokens_cached),
            ("prompt_seconds", "Time spent processing prompts", t.prompt_s),
            ("tokens_predicted", "Generated tokens", t.tokens_predicted),
            ("tokens_predicted_seconds", "Time spent generating tokens", t.predicted_s),
            ("n_decode", "Engine steps (one llama_decode each)", t.n_decode),
        )
        for name, text, value in counters:
            yield CounterMetricFamily(f"llamacpp:{name}", text, value=value)
        gauges = (
            ("n_tokens_max", "Largest prompt + generation of one request", t.n_tokens_max),
            ("prompt_tokens_seconds", "Average prompt throughput in tokens/s",
             t.prompt_tokens / t.prompt_s if t.prompt_s else 0.0),
            ("predicted_tokens_seconds", "Average generation throughput in tokens/s",
             t.tokens_predicted / t.predicted_s if t.predicted_s else 0.0),
            ("requests_processing", "Requests running", running),
            ("requests_deferred", "Requests waiting", waiting),
            ("n_busy_slots_per_decode", "Average sequences per engine step",
             t.busy_slots / max(t.n_decode, 1)),
        )
        for name, text, value in gauges:
            yield GaugeMetricFamily(f"llamacpp:{name}", text, value=value)
