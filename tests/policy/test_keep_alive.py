"""Keep-alive: Ollama's forms, which value holds, and what the resident set lets go when."""

from __future__ import annotations

import pytest

from sluice.policy.capacity.keep_alive import (
    PINNED,
    STAY,
    KeepAlive,
    effective_keep_alive,
    parse_keep_alive,
)
from sluice.policy.capacity.residency import Residency


@pytest.mark.parametrize(("value", "expected"), [
    (300, KeepAlive(idle_s=300.0)),
    (0, KeepAlive(idle_s=0.0)),
    (2.5, KeepAlive(idle_s=2.5)),
    ("5m", KeepAlive(idle_s=300.0)),
    ("1h30m", KeepAlive(idle_s=5400.0)),
    ("10s", KeepAlive(idle_s=10.0)),
    ("250ms", KeepAlive(idle_s=0.25)),
    ("300", KeepAlive(idle_s=300.0)),
    (-1, PINNED),
    ("-1", PINNED),
    ("-1m", PINNED),
])
def test_ollama_forms_parse(value: float | str, expected: KeepAlive) -> None:
    assert parse_keep_alive(value) == expected


@pytest.mark.parametrize("value", ["5x", "", "m", "5m3", "forever", True, float("inf")])
def test_bad_forms_are_refused_by_name(value: object) -> None:
    with pytest.raises(ValueError, match="keep_alive"):
        parse_keep_alive(value)  # type: ignore[arg-type]


def test_a_request_overrides_the_configured_value_but_never_a_configured_pin() -> None:
    five = KeepAlive(idle_s=300.0)
    zero = KeepAlive(idle_s=0.0)
    assert effective_keep_alive(five, zero) == zero
    assert effective_keep_alive(five, None) == five
    assert effective_keep_alive(five, PINNED) == PINNED
    assert effective_keep_alive(PINNED, zero) == PINNED


def resident(keep_alive: KeepAlive, *, now: float = 0.0, budget: int = 100) -> Residency:
    r = Residency(budget)
    r.commit_load("m", 40, 1.0, now, keep_alive)
    return r


def test_an_idle_model_expires_after_its_idle_time_and_not_before() -> None:
    r = resident(KeepAlive(idle_s=10.0))
    r.acquire("m", now=1.0)
    assert r.expired(now=100.0) == ()  # in use: never expires
    r.release("m", now=5.0)
    assert r.next_expiry_s() == 15.0
    assert r.expired(now=14.99) == ()
    assert r.expired(now=15.0) == ("m",)
    assert r.expired(now=15.0, busy={"m"}) == ()  # a request queued for it keeps it


def test_zero_expires_as_soon_as_the_last_request_ends() -> None:
    r = resident(KeepAlive(idle_s=0.0))
    r.acquire("m", now=1.0)
    r.acquire("m", now=1.0)
    r.release("m", now=2.0)
    assert r.expired(now=2.0) == ()  # one still uses it
    r.release("m", now=3.0)
    assert r.expired(now=3.0) == ("m",)


def test_stay_and_pinned_never_expire() -> None:
    for keep in (STAY, PINNED):
        r = resident(keep)
        assert r.expired(now=1e12) == () and r.next_expiry_s() is None


def test_next_expiry_after_skips_those_already_due() -> None:
    r = Residency(100)
    r.commit_load("a", 10, 1.0, 0.0, KeepAlive(idle_s=1.0))
    r.commit_load("b", 10, 1.0, 0.0, KeepAlive(idle_s=5.0))
    assert r.next_expiry_s() == 1.0
    assert r.next_expiry_s(after_s=2.0) == 5.0
    assert r.next_expiry_s(after_s=5.0) is None


def test_a_later_keep_alive_replaces_the_earlier_one() -> None:
    r = resident(KeepAlive(idle_s=300.0))
    r.set_keep_alive("m", KeepAlive(idle_s=0.0))
    assert r.expired(now=0.0) == ("m",)
    r.set_keep_alive("m", PINNED)
    assert r.expired(now=1e9) == ()


def test_eviction_never_takes_a_pinned_model() -> None:
    r = Residency(100)
    r.commit_load("pinned", 50, 0.0, 0.0, PINNED)  # cheapest and oldest: first victim else
    r.commit_load("other", 40, 9.0, 5.0)
    assert r.evictable_bytes == 40 and r.pinned_bytes == 50
    plan = r.plan_load("new", 50)
    assert plan is not None and plan.victims == ("other",)
    assert r.plan_load("big", 60) is None  # would need the pinned one
    assert not r.fits_beside_pins("big", 60)
    assert r.fits_beside_pins("new", 50)
    assert r.fits_beside_pins("pinned", 100)  # its own pin does not count against it
    r.check_integrity()
