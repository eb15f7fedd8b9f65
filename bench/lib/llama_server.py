"""llama.cpp's own ``llama-server``, the peer the LLM benchmarks compare sluice with: found
or built, and its command line.

``find()`` returns ``$SLUICE_LLAMA_SERVER`` when set, else a binary built earlier, else
builds one (``build()``: a few minutes on 2 cores) from the llama.cpp sources vendored in
the same llama-cpp-python source distribution that sluice pins, so both run the same
llama.cpp version. The build is cached in ``$SLUICE_CACHE_DIR/llama-server/<version>``
(``sluice.cache``; default root ``~/.cache/sluice``).

    python bench/lib/llama_server.py      # prints the binary's path
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from sluice.backends.llamacpp.options import _cpu_has_amx
from sluice.cache import cache_path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"


def cache_dir() -> Path:
    """Where the build of this llama.cpp version lives."""
    return cache_path("llama-server", LLAMA_CPP_PYTHON_VERSION)


def find(jobs: int = 2) -> Path:
    """The ``llama-server`` to benchmark against: ``$SLUICE_LLAMA_SERVER``, else the cached
    build, else a new build."""
    given = os.environ.get("SLUICE_LLAMA_SERVER")
    if given:
        path = Path(given)
        if not path.is_file():
            raise FileNotFoundError(f"SLUICE_LLAMA_SERVER={given} is not a file")
        return path
    return build(jobs)


def _run(cmd: list[str], cwd: Path | None = None) -> None:
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, cwd=cwd, check=True)


def build(jobs: int = 2) -> Path:
    """The path of a built ``llama-server`` (building it the first time)."""
    root = cache_dir()
    binary = root / "build" / "bin" / "llama-server"
    if binary.exists():
        return binary
    root.mkdir(parents=True, exist_ok=True)
    sdist = root / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    if not sdist.exists():
        _run([sys.executable, "-m", "pip", "download",
              f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "--no-deps", "--no-binary",
              ":all:", "-d", str(root)])
    src = root / "src"
    if not (src / "CMakeLists.txt").exists():
        with tarfile.open(sdist) as tar:
            prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(src, members=[m for m in members if m.name], filter="data")
    build_dir = root / "build"
    _run(["cmake", "-S", str(src), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release",
          "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
          "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON", "-DBUILD_SHARED_LIBS=OFF"])
    _run(["cmake", "--build", str(build_dir), "--target", "llama-server", "-j", str(jobs)])
    if not binary.exists():
        raise RuntimeError(f"build finished but {binary} is missing")
    shutil.rmtree(src / ".git", ignore_errors=True)
    return binary


def llama_server_cmd(binary: Path, gguf: Path, port: int, *, n_ctx: int, n_slots: int,
                     threads: int) -> list[str]:
    """llama-server serving ``gguf`` on 127.0.0.1:``port`` with the same threads, context
    and slots as the sluice it is compared with (one KV stream per slot, as sluice)."""
    return [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "-t", str(threads), "-tb", str(threads), "-c", str(n_ctx), "-np", str(n_slots),
            "-b", "512", "--no-webui", "--log-disable", "--no-kv-unified",
            # the same setting sluice uses on CPUs with AMX: llama.cpp's AMX repacked
            # matmul crashes this build (sluice/backends/llamacpp/options.py)
            *(["--no-repack"] if _cpu_has_amx() else [])]


if __name__ == "__main__":
    print(find())
