"""The bare backend loop: tokens/s of ``forward`` calls on llama.cpp with no engine and no
HTTP. The one in-process measurement the HTTP benchmarks print beside their rows, as the
ceiling a server on this host can approach."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def raw_ceiling(gguf: Path, batch: int = 8, steps: int = 48,
                n_ctx: int = 8192, threads: int = 2) -> float:
    """Tokens/s of bare ``forward`` calls on the backend (no engine, no HTTP), in a
    subprocess so its memory is gone before the servers run: the ceiling to compare to."""
    code = f"""
import time
from sluice.backends.base import ForwardChunk, ModelSpec
from sluice.backends.llamacpp import LlamaCppBackend
spec = ModelSpec("g", "generative", "llamacpp", 1, options={{"path": "{gguf}",
    "n_ctx": {n_ctx}, "n_seq_max": {max(8, batch)}, "n_threads": {threads}}})
m = LlamaCppBackend().load(spec)
toks = m.tokenize("Once upon a time there was a", add_bos=True)
m.forward([ForwardChunk(s, tuple(toks), 0, True) for s in range({batch})])
pos = len(toks)
t = time.perf_counter()
for i in range({steps}):
    m.forward([ForwardChunk(s, (toks[-1],), pos + i, True) for s in range({batch})])
print({batch} * {steps} / (time.perf_counter() - t))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    return float(out.stdout.strip().splitlines()[-1])
