"""The server records its traffic; the simulator replays the trace and makes the same
decisions: which worker each request went to (the ``Dispatcher`` log), where models were
loaded, and how every request ended."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import Any

import pytest

from sluice.backends.synthetic import SyntheticBackend
from sluice.config import Config
from sluice.engine.request import Final, RequestStatus, SamplingParams
from sluice.engine.runtime import Runtime
from sluice.sim import SimConfig, read_trace, simulate

CHAT = {"load_s": 0.002, "n_seq_max": 4, "n_ctx_per_seq": 256, "step_fixed_s": 0.001,
        "decode_per_seq_s": 0.0002, "prefill_per_token_s": 0.00001}
ONESHOT = {"load_s": 0.002, "batch_fixed_s": 0.001, "per_item_s": 0.0005}


def config(tmp_path: Path, router: str) -> Config:
    return Config.model_validate({
        "server": {"trace_file": str(tmp_path / "trace.jsonl")},
        "scheduling": {"router": router, "queue_capacity": 64},
        "workers": {"count": 2, "budget_bytes": 800_000_000, "inbox_capacity": 16},
        "batching": {"max_batch_size": 4, "max_wait_ms": 1},
        "models": [
            {"id": "a", "kind": "oneshot", "backend": "synthetic", "memory_bytes": 300_000_000,
             "options": ONESHOT},
            {"id": "b", "kind": "oneshot", "backend": "synthetic", "memory_bytes": 300_000_000,
             "task": "classification", "options": ONESHOT},
            {"id": "chat", "kind": "generative", "backend": "synthetic", "task": "generation",
             "memory_bytes": 500_000_000, "options": CHAT},
        ],
    })


MODELS = ["a", "chat", "b", "b", "a", "chat", "chat", "a", "b", "chat", "a", "a", "b", "chat",
          "b", "a", "chat", "b", "a", "chat"]


def run_server(cfg: Config, sequential: bool) -> tuple[list[tuple[int, int]], list[str],
                                                       list[tuple[int, str]]]:
    """Submit ``MODELS`` (one at a time, each waiting for the last to end, or all at
    once); returns the dispatcher's decisions, the end states, and the loads per worker."""
    rt = Runtime(cfg.runtime_config(), {"synthetic": SyntheticBackend()})
    rt._dispatcher.decisions = []
    loads: list[tuple[int, str]] = []
    rt.observer.model_loaded = lambda w, m, _s: loads.append((w, m))  # type: ignore[method-assign]
    rt.start()
    ends: dict[int, str] = {}
    try:
        done = threading.Semaphore(0)
        for i, model in enumerate(MODELS):
            spec = rt.spec_for(model)
            assert spec is not None
            kwargs: dict[str, Any] = (
                {"prompt_tokens": list(range(3, 3 + 8 + i)),
                 "params": SamplingParams(max_tokens=4 + i % 3, ignore_eos=True)}
                if spec.kind == "generative" else {"input": f"text {i}"})
            req = rt.new_request(model, **kwargs)

            def on_event(event: Any, rid: int = req.request_id) -> None:
                if isinstance(event, Final):
                    ends[rid] = event.status.name.lower()
                    done.release()

            req.listeners.append(on_event)
            assert rt.try_submit(req) is None
            if sequential:
                assert done.acquire(timeout=10)
        if not sequential:
            for _ in MODELS:
                assert done.acquire(timeout=10)
    finally:
        rt.stop(drain_timeout_s=2.0)
    assert rt._dispatcher.decisions is not None
    return list(rt._dispatcher.decisions), [ends[i] for i in sorted(ends)], loads


def per_worker(loads: list[tuple[int, str]]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for w, m in loads:
        out.setdefault(w, []).append(m)
    return out


@pytest.mark.parametrize(("router", "sequential"), [
    ("residency_aware", True), ("least_loaded", True), ("round_robin", True),
    ("round_robin", False),
])
def test_replayed_trace_makes_the_same_decisions(tmp_path: Path, router: str,
                                                 sequential: bool) -> None:
    cfg = config(tmp_path, router)
    decisions, ends, loads = run_server(cfg, sequential)
    arrivals = list(read_trace(tmp_path / "trace.jsonl"))
    assert [a.model for a in arrivals] == MODELS
    assert [a.input_chars for a in arrivals] == [  # one-shot inputs' lengths, none for LLM
        0 if m == "chat" else len(f"text {i}") for i, m in enumerate(MODELS)]
    assert all(a.time_s >= 0 for a in arrivals)
    # A bare runtime loads nothing at start (the HTTP server preloads its default model).
    sim_config = dataclasses.replace(SimConfig.from_config(cfg), preload=())
    report, fleet = simulate(sim_config, arrivals, keep_requests=True, record_decisions=True)
    replica = fleet.replicas[0]
    assert replica.dispatcher.decisions == decisions
    assert fleet.requests is not None
    assert [r.status for r in fleet.requests] == ends == ["completed"] * len(MODELS)
    assert per_worker(replica.loads) == per_worker(loads)
    assert RequestStatus.COMPLETED.name.lower() == "completed"
    assert report["requests"] == len(MODELS)
