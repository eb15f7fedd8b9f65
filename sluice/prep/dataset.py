"""The labelled data: the human-rated snippets (``hutto_ICWSM_2014.tar.gz``) inside the
``vadersentiment`` 3.3.2 source distribution; label = sign of the mean rating where
``|mean| >= 0.5``. A fixed seeded shuffle splits them 80 / 20 into train / test."""

from __future__ import annotations

import random
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

LABELS = ("negative", "positive")
VADER_SDIST = "vaderSentiment-3.3.2.tar.gz"
SPLIT_SEED = 20140601
TRAIN_FRACTION = 0.8


@dataclass(frozen=True)
class Example:
    text: str
    label: int
    """Index into ``LABELS``."""
    source: str


def vader_sdist(data_dir: Path) -> Path:
    """The vadersentiment source distribution, fetched with pip into ``data_dir`` once."""
    target = data_dir / VADER_SDIST
    if target.is_file():
        return target
    data_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
         "vadersentiment==3.3.2", "-d", str(data_dir)],
        check=True,
    )
    if not target.is_file():
        raise FileNotFoundError(f"pip download did not produce {target}")
    return target


def read_labelled(sdist: Path) -> list[Example]:
    """Every snippet with ``|mean rating| >= 0.5``, labelled by the rating's sign."""
    out: list[Example] = []
    with tarfile.open(sdist) as outer:
        member = next(m for m in outer.getmembers()
                      if m.name.endswith("additional_resources/hutto_ICWSM_2014.tar.gz"))
        inner_file = outer.extractfile(member)
        assert inner_file is not None
        with tarfile.open(fileobj=inner_file) as inner:
            for m in sorted(inner.getmembers(), key=lambda m: m.name):
                if not m.name.endswith("_GroundTruth.txt"):
                    continue
                f = inner.extractfile(m)
                assert f is not None
                source = Path(m.name).name.split("_")[0]
                for line in f.read().decode("utf-8", errors="replace").splitlines():
                    parts = line.lstrip("\ufeff").split("\t", 2)
                    if len(parts) != 3:
                        continue
                    try:
                        mean = float(parts[1])
                    except ValueError:
                        continue
                    text = parts[2].strip()
                    if abs(mean) >= 0.5 and text:
                        out.append(Example(text, int(mean > 0), source))
    return out


def split(examples: Sequence[Example], limit: int | None) -> tuple[list[Example], list[Example]]:
    """A fixed shuffle, cut to ``limit``, then 80 / 20 train / test."""
    items = list(examples)
    random.Random(SPLIT_SEED).shuffle(items)
    if limit is not None:
        items = items[:limit]
    cut = int(len(items) * TRAIN_FRACTION)
    return items[:cut], items[cut:]
