"""Incremental detokenization and stop strings."""

from __future__ import annotations

from sluice.engine.textstream import TextStream


def test_plain_text_passes_through() -> None:
    ts = TextStream()
    assert ts.push(b"Hello") == "Hello"
    assert ts.push(b" world") == " world"
    assert ts.flush() == ""
    assert ts.text == "Hello world"


def test_multibyte_character_split_over_tokens_is_held_until_complete() -> None:
    ts = TextStream()
    raw = "日".encode()
    assert ts.push(raw[:1]) == ""
    assert ts.push(raw[1:]) == "日"


def test_stop_string_is_cut_and_never_shown() -> None:
    ts = TextStream(stop=("END",))
    shown = ts.push(b"abc E")
    assert shown == "abc "  # "E" might start "END": held back
    shown += ts.push(b"N")
    assert not ts.stopped
    shown += ts.push(b"D tail")
    assert ts.stopped
    assert shown == "abc " and ts.text == "abc "
    assert ts.push(b"more") == ""


def test_held_back_prefix_is_released_when_it_does_not_complete() -> None:
    ts = TextStream(stop=("END",))
    assert ts.push(b"x E") == "x "
    assert ts.push(b"Q") == "EQ"
    assert ts.flush() == ""


def test_earliest_of_several_stops_wins() -> None:
    ts = TextStream(stop=("cd", "b"))
    ts.push(b"abcd")
    assert ts.stopped and ts.text == "a"
