"""Recording the server's own traffic as a trace the simulator replays (off by default).

One JSON object per submitted request, one line each, in submission order, in the
format ``sluice.sim.workload.read_trace`` reads: ``t`` (seconds since the runtime
started), ``model`` (as the request named it: a group stays a group), ``tenant``,
``prompt_tokens``, ``output_tokens`` (its ``max_tokens``), ``priority`` and, when it has
one, ``deadline_ms`` (relative); a one-shot request with text also ``input_chars`` (its
longest text's length, ``sluice.engine.variants.input_length``: what its batch's time
grows with). No prompt text is written. Thread-safe; each line is
flushed as written, so a trace survives a crash up to its last request.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from sluice.engine.request import Request
from sluice.engine.variants import input_length


class TraceWriter:
    """Appends one line per recorded request to ``path``."""

    def __init__(self, path: str | Path, start_s: float) -> None:
        self.path = Path(path)
        self.start_s = start_s
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self.written = 0

    def record(self, req: Request, named_model: str) -> None:
        line: dict[str, object] = {
            "t": round(req.arrival_s - self.start_s, 6),
            "model": named_model,
            "tenant": req.tenant_id,
            "prompt_tokens": len(req.prompt_tokens) if req.kind == "generative" else 1,
            "output_tokens": req.params.max_tokens if req.kind == "generative" else 1,
            "priority": req.priority,
        }
        if req.deadline_s is not None:
            line["deadline_ms"] = round((req.deadline_s - req.arrival_s) * 1000.0, 3)
        if req.kind != "generative" and (chars := input_length(req)) > 0:
            line["input_chars"] = chars
        text = json.dumps(line) + "\n"
        with self._lock:
            if not self._file.closed:
                self._file.write(text)
                self._file.flush()
                self.written += 1

    def close(self) -> None:
        with self._lock:
            self._file.close()
