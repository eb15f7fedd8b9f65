"""Grammar engines for constrained decoding, compared on Gemma 3's 262,144-token vocabulary.

For each engine that is importable: how it gets the GGUF vocabulary (the bytes of every
token from ``llama_token_to_piece``, control tokens marked special, the EOS ids), how long
it takes to build its tokenizer and compile a JSON schema, and the cost of the per-token
mask on a teacher-forced answer (the packaged model's own tokenization of a valid JSON
document, so every step is a real decoding state). The mask cost is what every decode step
of a constrained sequence pays; applying a bitmask to the logits row is the same numpy
work for all bitmask engines and is reported once.

Engines: llguidance (the one sluice uses), outlines-core, xgrammar (needs torch and
transformers installed), and llama.cpp's own grammar sampler (GBNF from llama-cpp-python's
JSON-schema converter, applied to a full ``llama_token_data_array`` as its sampler chain
does when the unconstrained pick is rejected).

    python bench/micro/grammar_engines.py [--steps-repeat 3]

Writes ``bench/results/grammar_engines.json`` (and prints a table). Run it in an
environment that has the engines you want compared; absent ones are reported as such.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parents[1] / "results" / "grammar_engines.json"

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "tags", "address", "active"],
    "additionalProperties": False,
}
DOCUMENT = {
    "name": "Ada Lovelace",
    "age": 36,
    "email": "ada@example.org",
    "tags": ["mathematics", "poetry", "engines"],
    "address": {"city": "London", "zip": "W1"},
    "active": True,
}


def _vocab() -> tuple[Any, Any, Any, list[bytes], set[int], list[int], int]:
    """The packaged GGUF's vocabulary: (lib, model, vocab, pieces, special ids, eos ids,
    n_vocab); control tokens are in ``special`` and their piece is their name."""
    import llama_cpp as lib

    from sluice.backends.packaged import gemma_gguf_path

    lib.llama_backend_init()
    params = lib.llama_model_default_params()
    params.vocab_only = True
    model = lib.llama_model_load_from_file(str(gemma_gguf_path()).encode(), params)
    vocab = lib.llama_model_get_vocab(model)
    n_vocab = int(lib.llama_vocab_n_tokens(vocab))
    buf = ctypes.create_string_buffer(256)
    pieces, special = [], set()
    for t in range(n_vocab):
        n = lib.llama_token_to_piece(vocab, t, buf, 256, 0, True)
        pieces.append(buf.raw[:n])
        attr = lib.llama_vocab_get_attr(vocab, t)
        if attr & (lib.LLAMA_TOKEN_ATTR_CONTROL | lib.LLAMA_TOKEN_ATTR_UNKNOWN):
            special.add(t)
    eos = [t for t in range(n_vocab) if lib.llama_vocab_is_eog(vocab, t)]
    return lib, model, vocab, pieces, special, eos, n_vocab


def _tokenize(lib: Any, vocab: Any, text: str) -> list[int]:
    data = text.encode()
    buf = (ctypes.c_int32 * (len(data) + 8))()
    n = lib.llama_tokenize(vocab, data, len(data), buf, len(data) + 8, False, False)
    return list(buf[:n])


def _summary_us(samples_s: list[float]) -> dict[str, float]:
    us = sorted(s * 1e6 for s in samples_s)
    return {
        "mean_us": round(statistics.fmean(us), 1),
        "p50_us": round(us[len(us) // 2], 1),
        "p99_us": round(us[min(len(us) - 1, int(len(us) * 0.99))], 1),
        "max_us": round(us[-1], 1),
    }


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


# -- engines ----------------------------------------------------------------------------------


def bench_llguidance(ctx: dict[str, Any], answer: list[int], repeat: int) -> dict[str, Any]:
    import llguidance
    import llguidance.numpy as llnp

    from sluice.engine.constraints.vocab import ll_tokenizer_from_table

    pieces, special, eos, n_vocab = ctx["pieces"], ctx["special"], ctx["eos"], ctx["n_vocab"]
    lib, vocab = ctx["lib"], ctx["vocab"]
    lltok, build_s = _timed(lambda: ll_tokenizer_from_table(
        pieces, special, eos, lambda s: _tokenize(lib, vocab, s)))
    grammar = llguidance.LLMatcher.grammar_from_json_schema(
        json.dumps(SCHEMA), defaults={"whitespace_flexible": False})
    matcher, compile_s = _timed(lambda: llguidance.LLMatcher(lltok, grammar, log_level=0))
    assert not matcher.is_error(), matcher.get_error()
    mask = llnp.allocate_token_bitmask(1, n_vocab)
    samples: list[float] = []
    for _ in range(repeat):
        m = llguidance.LLMatcher(lltok, grammar, log_level=0)
        for t in answer:
            _, dt = _timed(lambda m=m: llnp.fill_next_token_bitmask(m, mask))
            samples.append(dt)
            bit = (int(mask[0, t // 32]) >> (t % 32)) & 1
            assert bit, f"llguidance refused token {t} of a valid answer"
            assert m.consume_token(t), m.get_error()
        llnp.fill_next_token_bitmask(m, mask)
        assert all((int(mask[0, e // 32]) >> (e % 32)) & 1 for e in eos[:1])
    return {
        "version": llguidance.__version__,
        "vocabulary": "token bytes from llama_token_to_piece (control tokens marked "
                      "special with a 0xFF prefix, as llguidance.llamacpp does), EOS ids, "
                      "a tokenize callback; llguidance.llamacpp builds the same from a "
                      "llama_vocab pointer",
        "tokenizer_build_s": round(build_s, 3),
        "compile_s": round(compile_s, 4),
        "mask": _summary_us(samples),
        "kinds": "json_schema, json_object, regex, lark (CFG), all in one engine",
    }


def bench_outlines_core(ctx: dict[str, Any], answer: list[int], repeat: int) -> dict[str, Any]:
    import outlines_core as oc
    from outlines_core.json_schema import build_regex_from_schema

    pieces, special, eos, n_vocab = ctx["pieces"], ctx["special"], ctx["eos"], ctx["n_vocab"]
    table: dict[bytes, list[int]] = {}
    for t, p in enumerate(pieces):
        if t in special or t in eos or not p:
            continue
        table.setdefault(p, []).append(t)
    vocabulary, vocab_s = _timed(lambda: oc.Vocabulary(eos[0], table))
    regex = build_regex_from_schema(json.dumps(SCHEMA), r"[ ]?")
    index, compile_s = _timed(lambda: oc.Index(regex, vocabulary))
    mask = np.zeros((n_vocab + 31) // 32, dtype=np.int32)
    samples: list[float] = []
    for _ in range(repeat):
        guide = oc.Guide(index)
        for t in answer:
            _, dt = _timed(lambda g=guide: g.write_mask_into(mask.ctypes.data, mask.size, 4))
            samples.append(dt)
            assert (int(mask[t // 32]) >> (t % 32)) & 1, f"outlines refused token {t}"
            guide.advance(t)
    return {
        "version": _version("outlines-core"),
        "vocabulary": "a map piece bytes -> token ids (special tokens left out by hand), "
                      "one EOS id",
        "tokenizer_build_s": round(vocab_s, 3),
        "compile_s": round(compile_s, 3),
        "mask": _summary_us(samples),
        "kinds": "regex only (JSON schema through a regex; no recursion, so json_object "
                 "and recursive schemas are approximated by bounded depth; no lark/CFG)",
    }


def bench_xgrammar(ctx: dict[str, Any], answer: list[int], repeat: int) -> dict[str, Any]:
    import xgrammar as xg

    pieces, special, eos, n_vocab = ctx["pieces"], ctx["special"], ctx["eos"], ctx["n_vocab"]
    encoded = [b"" if t in special else p for t, p in enumerate(pieces)]
    # xgrammar takes a special token as one whose encoded piece is empty
    info, vocab_s = _timed(lambda: xg.TokenizerInfo(
        encoded, xg.VocabType.RAW, vocab_size=n_vocab, stop_token_ids=eos))
    compiler = xg.GrammarCompiler(info, max_threads=1)
    compiled, compile_s = _timed(lambda: compiler.compile_json_schema(
        json.dumps(SCHEMA), any_whitespace=False, separators=(",", ":")))
    bitmask = xg.allocate_token_bitmask(1, n_vocab)
    samples: list[float] = []
    for _ in range(repeat):
        matcher = xg.GrammarMatcher(compiled)
        for t in answer:
            _, dt = _timed(lambda m=matcher: m.fill_next_token_bitmask(bitmask))
            samples.append(dt)
            assert (int(bitmask[0, t // 32]) >> (t % 32)) & 1, f"xgrammar refused token {t}"
            assert matcher.accept_token(t)
    return {
        "version": _version("xgrammar"),
        "vocabulary": "TokenizerInfo(encoded vocab bytes, VocabType.RAW, stop ids, special "
                      "ids); its bitmask is a torch tensor",
        "tokenizer_build_s": round(vocab_s, 3),
        "compile_s": round(compile_s, 3),
        "mask": _summary_us(samples),
        "kinds": "json_schema, json_object, regex, EBNF; requires torch + transformers "
                 "(+ triton on x86_64 Linux) as hard dependencies",
    }


def bench_llamacpp_grammar(ctx: dict[str, Any], answer: list[int], repeat: int) -> dict[str, Any]:
    import llama_cpp as lib
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    n_vocab, vocab = ctx["n_vocab"], ctx["vocab"]
    gbnf = json_schema_to_gbnf(json.dumps(SCHEMA))
    data = np.zeros(n_vocab, dtype=[("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
    ids = np.arange(n_vocab, dtype=np.int32)
    logits = np.random.default_rng(0).normal(size=n_vocab).astype(np.float32)
    arr = lib.llama_token_data_array(
        data=data.ctypes.data_as(ctypes.POINTER(lib.llama_token_data)), size=n_vocab,
        selected=-1, sorted=False)
    smpl, compile_s = _timed(lambda: lib.llama_sampler_init_grammar(
        vocab, gbnf.encode(), b"root"))
    lib.llama_sampler_free(smpl)
    samples: list[float] = []
    for _ in range(repeat):
        smpl = lib.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
        for t in answer:
            def apply(smpl: Any = smpl) -> None:
                data["id"] = ids
                data["logit"] = logits
                arr.size = n_vocab
                arr.selected = -1
                arr.sorted = False
                lib.llama_sampler_apply(smpl, ctypes.byref(arr))
            _, dt = _timed(apply)
            samples.append(dt)
            assert np.isfinite(data["logit"][t]), f"llama.cpp grammar refused token {t}"
            lib.llama_sampler_accept(smpl, t)
        lib.llama_sampler_free(smpl)
    return {
        "version": _version("llama-cpp-python"),
        "vocabulary": "the llama_vocab itself (no conversion)",
        "tokenizer_build_s": 0.0,
        "compile_s": round(compile_s, 4),
        "mask": _summary_us(samples),
        "kinds": "GBNF (JSON schema through llama-cpp-python's converter); masks by "
                 "walking every candidate token through the grammar stacks",
    }


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


ENGINES = {
    "llguidance": bench_llguidance,
    "outlines-core": bench_outlines_core,
    "xgrammar": bench_xgrammar,
    "llama.cpp grammar": bench_llamacpp_grammar,
}


def _apply_cost(n_vocab: int, repeat: int = 50) -> dict[str, float]:
    """Applying a bitmask to one logits row with numpy (the same for every bitmask engine)."""
    from sluice.engine.constraints.masking import apply_bitmask

    rng = np.random.default_rng(1)
    mask = rng.integers(-(2**31), 2**31, size=(n_vocab + 31) // 32, dtype=np.int64)
    mask32 = mask.astype(np.int32)
    row = rng.normal(size=n_vocab).astype(np.float32)
    samples = []
    for _ in range(repeat):
        work = row.copy()
        _, dt = _timed(lambda w=work: apply_bitmask(w, mask32))
        samples.append(dt)
    return _summary_us(samples)


def _one_engine(name: str, repeat: int) -> dict[str, Any]:
    """Measure one engine in this process (run in a child process by ``main``)."""
    lib, _model, vocab, pieces, special, eos, n_vocab = _vocab()
    ctx = {"lib": lib, "vocab": vocab, "pieces": pieces, "special": special, "eos": eos,
           "n_vocab": n_vocab}
    answer = _tokenize(lib, vocab, json.dumps(DOCUMENT, separators=(",", ":")))
    try:
        return ENGINES[name](ctx, answer, repeat)
    except ImportError as exc:
        return {"absent": str(exc)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="teacher-forced passes per engine")
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--engine-timeout-s", type=float, default=420.0,
                        help="an engine that takes longer (e.g. building an index over the "
                             "vocabulary) is reported as timed out")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_one_engine(args.child, args.repeat)))
        return
    results: dict[str, Any] = {}
    if args.engines != ",".join(ENGINES) and RESULTS.exists():  # a rerun of some engines
        results = json.loads(RESULTS.read_text())["engines"]
    for name in args.engines.split(","):
        cmd = [sys.executable, __file__, "--child", name, "--repeat", str(args.repeat)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True,
                                  timeout=args.engine_timeout_s, check=False)
            lines = done.stdout.strip().splitlines()
            results[name] = (json.loads(lines[-1]) if done.returncode == 0 and lines
                             else {"failed": done.stderr.strip().splitlines()[-3:]})
        except subprocess.TimeoutExpired:
            results[name] = {"timed_out_s": args.engine_timeout_s}
        print(name, json.dumps(results[name]), flush=True)
    lib, model, vocab, _, _, _, n_vocab = _vocab()
    answer = _tokenize(lib, vocab, json.dumps(DOCUMENT, separators=(",", ":")))
    out = {
        "machine": {"cpu": platform.processor() or platform.machine(), "python":
                    platform.python_version()},
        "vocab_size": n_vocab,
        "answer_tokens": len(answer),
        "schema": SCHEMA,
        "apply_bitmask_numpy": _apply_cost(n_vocab),
        "engines": results,
    }
    lib.llama_model_free(model)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
