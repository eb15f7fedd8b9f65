"""Build llama.cpp's own ``llama-server`` once, from the llama.cpp sources vendored in the
same llama-cpp-python source distribution that sluice pins, so both run the same
llama.cpp version. The binary is cached in ``$SLUICE_CACHE_DIR/llama-server/<version>``
(``sluice.cache``; default root ``~/.cache/sluice``); later calls return it at once.

    python bench/llama_server_build.py      # prints the binary's path
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from sluice.cache import cache_path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"


def cache_dir() -> Path:
    return cache_path("llama-server", LLAMA_CPP_PYTHON_VERSION)


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


if __name__ == "__main__":
    print(build())
