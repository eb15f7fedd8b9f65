"""Build hook: generate sluice's gRPC modules from ``sluice/v1/*.proto`` with grpcio-tools.

The metadata lives in ``pyproject.toml``; this file only adds the code generation. It runs
in ``build_py``, the step every setuptools build goes through: ``pip install .``, wheels
(``pip wheel .``, ``python -m build``, the Docker builder stage) and editable installs
(``pip install -e .``, which scripts/test.sh runs on every CI clone). The modules are
written beside the ``.proto`` in the source tree (so an editable install imports them) and
are then copied into the wheel like any module; they are never committed (.gitignore).
grpcio-tools is a build requirement (``[build-system] requires``), pinned to the version
whose protobuf the ``grpc`` extra installs, since generated code checks the runtime's
protobuf version on import.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTO_DIR = ROOT / "sluice" / "v1"


def generate_grpc_modules() -> None:
    """``protoc`` (bundled with grpcio-tools) for each proto: messages, their type stubs,
    and the service stubs."""
    from grpc_tools import protoc

    well_known = str(resources.files("grpc_tools") / "_proto")
    for proto in sorted(PROTO_DIR.glob("*.proto")):
        args = [
            "grpc_tools.protoc",
            f"--proto_path={ROOT}",
            f"--proto_path={well_known}",
            f"--python_out={ROOT}",
            f"--pyi_out={ROOT}",
            f"--grpc_python_out={ROOT}",
            str(proto.relative_to(ROOT)),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed on {proto.relative_to(ROOT)}")


class BuildPyWithProtos(build_py):
    """``build_py`` that generates the gRPC modules first (they are then collected as
    ordinary modules of ``sluice.v1``)."""

    def run(self) -> None:
        generate_grpc_modules()
        super().run()


setup(cmdclass={"build_py": BuildPyWithProtos})
