"""The synthetic backend: builds synthetic models and tokenizers from specs."""

from __future__ import annotations

from sluice.backends.base import GenerativeModel, ModelLoadError, ModelSpec, OneShotModel
from sluice.backends.synthetic.cost import sleep
from sluice.backends.synthetic.generative import SyntheticGenerative
from sluice.backends.synthetic.oneshot import SyntheticOneShot
from sluice.backends.synthetic.tokenizer import SyntheticTokenizer


class SyntheticBackend:
    """Builds synthetic models; counts loads for tests."""

    name = "synthetic"

    def __init__(self) -> None:
        self.loads: list[str] = []

    def load(self, spec: ModelSpec) -> OneShotModel | GenerativeModel:
        if spec.options.get("fail_load"):
            raise ModelLoadError(f"injected load failure for {spec.model_id}")
        scale = float(spec.options.get("speed_scale", 1.0))
        sleep(float(spec.options.get("load_s", 0.01)) * scale)
        self.loads.append(spec.model_id)
        if spec.kind == "generative":
            return SyntheticGenerative(spec)
        return SyntheticOneShot(spec)

    def load_tokenizer(self, spec: ModelSpec) -> SyntheticTokenizer:
        return SyntheticTokenizer(spec)
