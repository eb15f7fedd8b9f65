"""``sluice profile``: service-time distributions per variant and batch size, measured
through the same runtime → worker → backend path the server uses, and a cross-check of
every variant's served outputs against a separate ONNX Runtime session.

For each batch size a fresh runtime is built whose batcher closes a batch exactly when
it holds that many requests; that many requests are submitted at once, and the worker's
own timing of ``run_batch`` (what the planner's online estimate also sees) is recorded.

The cross-check sends held-out texts one at a time through the served classification
and embedding models of each variant, and through an ``Encoder`` opened separately on
the file the manifest names for that variant: the predicted labels must be the same and
every embedding's cosine similarity >= 0.999. A mismatch (say, the wrong model file
configured under a variant's name) raises ``ProfileMismatch``; the CLI exits 1.
"""

from __future__ import annotations

import json
import platform
import statistics
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from sluice.backends.base import Backend, ModelSpec
from sluice.backends.registry import make_backends
from sluice.config import Config
from sluice.engine.observer import Observer
from sluice.engine.request import Final, RequestStatus
from sluice.engine.runtime import Runtime, RuntimeConfig

MIN_COSINE = 0.999
PROFILE = "profile.json"


class ProfileMismatch(RuntimeError):
    """A variant's served outputs differ from its reference session's."""


class _BatchTimes(Observer):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.samples: list[tuple[str, int, float]] = []

    def batch_done(self, worker_id: int, model_id: str, size: int, seconds: float) -> None:
        with self.lock:
            self.samples.append((model_id, size, seconds))


def _runtime(config: RuntimeConfig, backends: dict[str, Backend], batch: int,
             observer: Observer) -> Runtime:
    workers = tuple(replace(w, max_batch_size=batch, max_wait_s=5.0,
                            inbox_capacity=max(batch, w.inbox_capacity))
                    for w in config.workers[:1])
    rt = Runtime(replace(config, workers=workers, groups=(),
                         queue=replace(config.queue, queue_capacity=max(64, batch * 2))),
                 backends, observer=observer)
    rt.start()
    return rt


def _wait(rt: Runtime, model_id: str, inputs: Sequence[str], timeout_s: float = 120.0
          ) -> list[Final]:
    """Submit ``inputs`` at once (one request each) and wait for all of them."""
    done = threading.Event()
    finals: list[Final | None] = [None] * len(inputs)
    left = [len(inputs)]
    lock = threading.Lock()
    reqs = []
    for i, text in enumerate(inputs):
        req = rt.new_request(model_id, input=text)

        def on_event(event: Any, i: int = i) -> None:
            if isinstance(event, Final):
                with lock:
                    finals[i] = event
                    left[0] -= 1
                    if left[0] == 0:
                        done.set()

        req.listeners.append(on_event)
        reqs.append(req)
    for req in reqs:
        rejection = rt.submit(req, timeout_s=timeout_s)
        if rejection is not None:
            raise RuntimeError(f"profile request rejected: {rejection.message}")
    if not done.wait(timeout_s):
        raise RuntimeError(f"{model_id}: requests did not finish within {timeout_s} s")
    out = [f for f in finals if f is not None]
    for f in out:
        if f.status != RequestStatus.COMPLETED:
            raise RuntimeError(f"{model_id}: request ended {f.status.name}: {f.error}")
    return out


def measure(config: RuntimeConfig, backends: dict[str, Backend], models: Sequence[str],
            texts: Sequence[str], batch_sizes: Sequence[int], repeats: int,
            longest: dict[int, list[int]] | None = None) -> dict[str, Any]:
    """``{model: {batch_size: [seconds, ...]}}`` through the serving path, in the order
    run. ``longest``, if given, receives ``{batch_size: [longest text's characters, ...]}``
    of the same batches (the same for every model)."""
    out: dict[str, Any] = {m: {} for m in models}
    if longest is not None:
        for b in batch_sizes:
            longest[b] = [max(len(t) for t in texts[s:s + b]) for s in
                          ((r * b) % max(1, len(texts) - b) for r in range(repeats))]
    for b in batch_sizes:
        obs = _BatchTimes()
        rt = _runtime(config, backends, b, obs)
        try:
            for m in models:
                _wait(rt, m, texts[:b])  # warm-up: load, first-run allocations
                with obs.lock:
                    obs.samples.clear()
                for r in range(repeats):
                    start = (r * b) % max(1, len(texts) - b)
                    _wait(rt, m, texts[start:start + b])
                with obs.lock:
                    out[m][b] = [s for mid, size, s in obs.samples if mid == m and size == b]
        finally:
            rt.stop(drain_timeout_s=5.0)
    return out


def length_fit(times_s: Mapping[int, Sequence[float]], longest: Mapping[int, Sequence[int]]
               ) -> dict[str, Any] | None:
    """How a variant's batch time grows with its longest input, from the profile's own
    batches: the least-squares slope of ``seconds / mean seconds at that batch size`` on
    ``longest characters / mean longest at that batch size``, pooled over batch sizes (the
    ratio and length the server's ``LengthSlope`` fits online), with the lengths' mean
    and variance, and each size's mean longest input (``typical_longest_chars``). Both
    ratios are 1 at each size's mean, so the sizes share one line: in characters, batches
    of 8 (longer longest inputs, at no cost over their own curve) would flatten the slope
    that batches of 1 show. ``slope`` is clipped at 0. None when fewer than 2 batches or
    their lengths do not differ."""
    xs: list[float] = []
    ys: list[float] = []
    typical: dict[str, float] = {}
    for b, samples in sorted(times_s.items()):
        lengths = longest.get(b, [])
        if len(lengths) != len(samples) or not samples or not any(lengths):
            continue
        mean_s = statistics.fmean(samples)
        mean_chars = statistics.fmean(lengths)
        typical[str(b)] = round(mean_chars, 2)
        xs.extend(x / mean_chars for x in lengths)
        ys.extend(s / mean_s for s in samples)
    if len(xs) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = statistics.fmean((x - mx) ** 2 for x in xs)
    if var <= 0:
        return None
    cov = statistics.fmean((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    return {"slope": round(max(0.0, cov / var), 6), "mean": round(mx, 6),
            "var": round(var, 6), "typical_longest_chars": typical, "batches": len(xs)}


def cross_check(config: RuntimeConfig, backends: dict[str, Backend], manifest: dict[str, Any],
                pairs: Sequence[tuple[ModelSpec, ModelSpec | None]],
                texts: Sequence[str]) -> dict[str, Any]:
    """Served (classification, embedding) outputs of each variant vs a reference
    ``Encoder`` on the manifest's file for that variant. Raises ``ProfileMismatch``."""
    from sluice.backends.onnx import Encoder, Head

    report: dict[str, Any] = {}
    rt = _runtime(config, backends, 1, Observer())
    try:
        for cls_spec, emb_spec in pairs:
            name = str(cls_spec.options.get("variant", cls_spec.model_id))
            ref = manifest["variants"][name]
            encoder = Encoder(ref["path"], ref["tokenizer"], threads=1, pad_id=ref["pad_id"])
            head = Head(ref["head"])
            ref_emb = np.concatenate([encoder.embed([t]) for t in texts])
            ref_labels = np.argmax(head.probabilities(ref_emb), axis=1)
            served = [_wait(rt, cls_spec.model_id, [t])[0].result for t in texts]
            labels = [head.labels.index(max(r, key=r.get)) for r in served]
            same = int(sum(int(a == b) for a, b in zip(labels, ref_labels, strict=True)))
            entry: dict[str, Any] = {"texts": len(texts), "same_labels": same}
            problems = []
            if same != len(texts):
                problems.append(f"{len(texts) - same} of {len(texts)} labels differ")
            if emb_spec is not None:
                vecs = np.array([_wait(rt, emb_spec.model_id, [t])[0].result.vector
                                 for t in texts],
                                dtype=np.float32)
                cos = np.sum(vecs * ref_emb, axis=1) / np.maximum(
                    np.linalg.norm(vecs, axis=1) * np.linalg.norm(ref_emb, axis=1), 1e-12)
                entry["min_cosine"] = round(float(cos.min()), 6)
                if float(cos.min()) < MIN_COSINE:
                    problems.append(f"min cosine {float(cos.min()):.4f} < {MIN_COSINE}")
            entry["ok"] = not problems
            report[name] = entry
            if problems:
                raise ProfileMismatch(
                    f"variant {name}: served model {cls_spec.model_id} "
                    f"({cls_spec.options.get('path')}) disagrees with the reference session on "
                    f"{ref['path']}: {'; '.join(problems)}"
                )
    finally:
        rt.stop(drain_timeout_s=5.0)
    return report


def run_profile(config: Config, manifest: dict[str, Any], *, batch_sizes: Sequence[int],
                repeats: int, n_check: int = 32, out: Path | None = None) -> dict[str, Any]:
    """Cross-check, then profile every classification variant of the config."""
    rc = config.runtime_config()
    backends = dict(make_backends(m.backend for m in config.models))
    cls = [s for s in rc.models if s.backend == "onnx" and s.task == "classification"]
    emb = {str(s.options.get("variant")): s for s in rc.models
           if s.backend == "onnx" and s.task == "embedding"}
    texts = [json.loads(line)["text"] for line in
             Path(manifest["test_file"]).read_text().splitlines()]
    if not texts:
        raise RuntimeError("the manifest's test split is empty")
    check = cross_check(rc, backends, manifest,
                        [(s, emb.get(str(s.options.get("variant")))) for s in cls],
                        texts[:n_check])
    t0 = time.monotonic()
    longest: dict[int, list[int]] = {}
    times = measure(rc, backends, [s.model_id for s in cls], texts, batch_sizes, repeats,
                    longest)
    variants: dict[str, Any] = {}
    for s in cls:
        name = str(s.options.get("variant", s.model_id))
        per_b = times[s.model_id]
        variants[name] = {
            "model": s.model_id,
            "accuracy": s.options.get("accuracy"),
            "threads": s.options.get("threads", 1),
            "batch_ms": {str(b): round(statistics.fmean(v) * 1000, 3) for b, v in per_b.items()},
            "p50_ms": {str(b): round(statistics.median(v) * 1000, 3) for b, v in per_b.items()},
            "p95_ms": {str(b): round(float(np.percentile(v, 95)) * 1000, 3)
                       for b, v in per_b.items()},
            "samples": {str(b): len(v) for b, v in per_b.items()},
            "length": length_fit(per_b, longest),
        }
    result = {
        "machine": {"python": platform.python_version(), "cpu": platform.processor() or
                    platform.machine(), "cores": _cores()},
        "batch_sizes": list(batch_sizes), "repeats": repeats,
        "profile_seconds": round(time.monotonic() - t0, 1),
        "cross_check": check, "variants": variants,
    }
    if out is not None:
        out.write_text(json.dumps(result, indent=2) + "\n")
    return result


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
