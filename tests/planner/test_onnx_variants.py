"""The real small variants (paraphrase-MiniLM-L3 FP32/INT8, all-MiniLM-L6 INT8) built by
``sluice prepare``: served through the HTTP server, and cross-checked by ``profile``."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sluice import prep
from sluice.backends.onnx import Encoder
from sluice.config import Config
from sluice.prep.profile import ProfileMismatch, run_profile
from tests.planner.conftest import SMALL_LIMIT, small_cache_dir
from tests.server.live import LiveServer

pytestmark = [pytest.mark.onnx, pytest.mark.timeout(900)]

SMALL = {"l3-fp32", "l3-int8", "minilm-int8"}


def config(manifest: dict[str, Any], **kwargs: Any) -> Config:
    return Config.model_validate(prep.config_dict(manifest, **kwargs))


def test_prepare_builds_the_small_variants_once(small_manifest: dict[str, Any]) -> None:
    assert set(small_manifest["variants"]) >= SMALL
    assert small_manifest["data"]["n_train"] + small_manifest["data"]["n_test"] == SMALL_LIMIT
    for name in SMALL:
        v = small_manifest["variants"][name]
        assert 0.6 < v["accuracy"] <= 1.0, (name, v["accuracy"])
    t0 = time.monotonic()
    again = prep.prepare(small_cache_dir(), limit=SMALL_LIMIT, quiet=True)
    assert time.monotonic() - t0 < 20  # idempotent: nothing is rebuilt
    assert again["variants"] == small_manifest["variants"]


@pytest.fixture(scope="module")
def onnx_server(small_manifest: dict[str, Any],
                serve_module: Callable[..., LiveServer]) -> LiveServer:
    return serve_module(config(small_manifest, deadline_ms=10_000))


def test_embeddings_through_the_server(onnx_server: LiveServer,
                                       small_manifest: dict[str, Any]) -> None:
    texts = ["A wonderful, moving film.", "A truly great movie!", "The invoice is overdue."]
    with onnx_server.client() as c:
        r = c.post("/v1/embeddings", json={"model": "embed-l3-fp32", "input": texts})
        g = c.post("/v1/embeddings", json={"model": "embed", "input": texts[0]})
    assert r.status_code == 200, r.text
    vecs = np.array([d["embedding"] for d in r.json()["data"]], dtype=np.float32)
    assert vecs.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)
    assert vecs[0] @ vecs[1] > vecs[0] @ vecs[2]  # the two reviews are closer
    v = small_manifest["variants"]["l3-fp32"]
    ref, tokens = Encoder(v["path"], v["tokenizer"]).embed_counted(texts)
    assert np.min(np.sum(ref * vecs, axis=1)) >= 0.999
    # usage: the tokens the encoder read ([CLS] and [SEP] included), not the words
    assert tokens[0] != len(texts[0].split())
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] == sum(tokens)
    assert g.status_code == 200, g.text
    assert g.headers["x-sluice-variant"] == f"embed-{prep.by_accuracy(small_manifest)[0]}"


def test_classification_through_the_server(onnx_server: LiveServer,
                                           small_manifest: dict[str, Any]) -> None:
    cases = {"I absolutely loved it, a wonderful and joyful film.": "positive",
             "Awful. Boring, painful, a total waste of money.": "negative"}
    best = prep.by_accuracy(small_manifest)[0]
    with onnx_server.client() as c:
        for text, label in cases.items():
            r = c.post("/v1/infer", json={"model": "sentiment", "input": text,
                                          "deadline_ms": 5000})
            assert r.status_code == 200, r.text
            probs = r.json()["output"]
            assert max(probs, key=probs.get) == label, probs
            assert r.headers["x-sluice-variant"] == f"sentiment-{best}"
            assert "x-sluice-predicted-wait-ms" in r.headers
            direct = c.post("/v1/infer", json={"model": "sentiment-l3-int8", "input": text})
            assert direct.status_code == 200
            assert max(direct.json()["output"], key=direct.json()["output"].get) == label


def test_profile_cross_check_passes_and_catches_a_wrong_model_file(
        small_manifest: dict[str, Any]) -> None:
    names = ["minilm-int8", "l3-int8"]
    good = config(small_manifest, variants=names)
    result = run_profile(good, small_manifest, batch_sizes=[1, 4], repeats=3, n_check=12)
    assert set(result["cross_check"]) == set(names)
    assert all(v["ok"] and v["min_cosine"] >= 0.999 for v in result["cross_check"].values())
    for name in names:
        assert all(v > 0 for v in result["variants"][name]["batch_ms"].values())
        ms = result["variants"][name]["p50_ms"]  # medians: one stalled repeat moves a mean
        assert 0 < ms["1"] < ms["4"] * 2
        fit = result["variants"][name]["length"]  # the texts differ in length
        assert fit["batches"] == 6 and fit["slope"] >= 0 and fit["var"] > 0
        assert set(fit["typical_longest_chars"]) == {"1", "4"}
    served = prep.config_dict(small_manifest, variants=names, profile=result)
    assert all("length_prior" in m["options"] for m in served["models"])
    # Serve L3's file under MiniLM's name: the reference session on MiniLM's file disagrees.
    data = prep.config_dict(small_manifest, variants=names)
    wrong = small_manifest["variants"]["l3-int8"]["path"]
    for m in data["models"]:
        if m["options"]["variant"] == "minilm-int8":
            m["options"]["path"] = wrong
    with pytest.raises(ProfileMismatch, match="minilm-int8"):
        run_profile(Config.model_validate(data), small_manifest, batch_sizes=[1], repeats=1,
                    n_check=12)


def test_profile_cli_fails_loudly_on_a_wrong_file(
        small_manifest: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from sluice.cli import main

    config_file = tmp_path / "wrong.toml"
    prep.write_config(small_manifest, config_file, variants=["l3-int8"])
    config_file.write_text(config_file.read_text().replace(
        small_manifest["variants"]["l3-int8"]["path"],
        small_manifest["variants"]["minilm-int8"]["path"]))
    rc = main(["profile", "--cache", small_manifest["cache_dir"], "--config", str(config_file),
               "--batch-sizes", "1", "--repeats", "1", "--out", str(tmp_path / "p.json")])
    assert rc == 1
    assert "PROFILE FAILED" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_corrupt_onnx_file_is_a_clear_load_error_and_others_still_serve(
    small_manifest: dict[str, Any], tmp_path: Path, damage: str,
    serve: Callable[..., LiveServer],
) -> None:
    from sluice.backends.base import ModelLoadError, ModelSpec
    from sluice.backends.onnx import OnnxBackend

    good = small_manifest["variants"]["l3-fp32"]
    broken = tmp_path / "broken.onnx"
    raw = Path(good["path"]).read_bytes()
    broken.write_bytes(raw[: len(raw) // 3] if damage == "truncated" else b"not onnx" * 512)
    spec = ModelSpec("broken", "oneshot", "onnx", 1, task="embedding",
                     options={"path": str(broken), "tokenizer": good["tokenizer"]})
    with pytest.raises(ModelLoadError, match="broken"):
        OnnxBackend().load(spec)

    cfg = config(small_manifest).model_dump()
    cfg["models"].append({"id": "broken", "kind": "oneshot", "backend": "onnx",
                          "task": "embedding", "memory_bytes": 1_000_000,
                          "options": {"path": str(broken), "tokenizer": good["tokenizer"]}})
    live = serve(Config.model_validate(cfg))
    with live.client() as c:
        r = c.post("/v1/embeddings", json={"model": "broken", "input": "hello"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_load_failed"
        ok = c.post("/v1/embeddings", json={"model": "embed-l3-fp32", "input": "hello"})
        assert ok.status_code == 200 and len(ok.json()["data"][0]["embedding"]) > 0
        assert c.get("/health").status_code == 200
