"""The crash barrier at the engine: what one request brings (its prompt, its parameters)
fails that request alone, in the step it would have broken, and the others finish."""

from __future__ import annotations

import pytest

from sluice.engine.request import RequestStatus
from tests.engine.test_continuous import engine, request, run_to_idle


@pytest.mark.parametrize("prompt", [(), (5, 100_000), (-1, 5)])
def test_a_prompt_the_model_cannot_run_fails_alone(prompt: tuple[int, ...]) -> None:
    eng, _ = engine()
    good, bad = request(), request()
    bad.prompt_tokens = prompt
    eng.add(good)
    eng.add(bad)
    run_to_idle(eng)
    assert bad.final is not None and bad.final.error_code == "invalid_request_error"
    assert good.final is not None and good.final.status == RequestStatus.COMPLETED
    assert eng.kv.free_blocks == eng.kv.total_blocks


def test_a_penalty_that_breaks_the_shared_row_preparation_fails_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """If the step's batch preparation of logits rows raises (one request's values), each
    request prepares its own row in its own barrier: only the one at fault fails."""
    from sluice.engine.chooser import BatchRows

    real = BatchRows.build

    def build(logits, jobs):  # type: ignore[no-untyped-def]
        if any(c.params.frequency_penalty == 1.5 for c, _ in jobs):
            raise FloatingPointError("injected: this request's penalty breaks the batch")
        return real(logits, jobs)

    monkeypatch.setattr(BatchRows, "build", staticmethod(build))
    eng, _ = engine()
    good = request(frequency_penalty=0.5)
    bad = request(frequency_penalty=1.5)
    eng.add(good)
    eng.add(bad)
    run_to_idle(eng)
    assert good.final is not None and good.final.status == RequestStatus.COMPLETED
    assert bad.final is not None and bad.final.status == RequestStatus.FAILED
    assert "FloatingPointError" in (bad.final.error or "")
