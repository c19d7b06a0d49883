"""The leak detector of tests/integration/test_conversation_isolation.py can fail: it flags a planted foreign marker."""

from __future__ import annotations

from tests.isolation import PREFIX, Transcript, foreign_markers, leaks, new_markers, shows


def conversation(marker: str, reply: str) -> Transcript:
    user = f"My code word is {marker}. Remember it."
    history = [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    return Transcript(marker, [reply], history)


def test_markers_are_distinct_random_and_new_on_every_call() -> None:
    markers = new_markers(16)
    assert len(set(markers)) == 16 and all(m.startswith(PREFIX) and len(m) == 8 for m in markers)
    assert set(markers).isdisjoint(new_markers(16)), "two runs share no marker (36**6 choices each)"


def test_a_foreign_marker_is_found_whatever_its_case_or_separators() -> None:
    own, other, third = markers = new_markers(3)
    assert foreign_markers(f"Your code word is {own}.", own, markers) == []
    assert foreign_markers(f"Your code word is {other}.", own, markers) == [other]
    spaced = " ".join(other.lower()[:4]) + "-" + other[4:]  # the model may change case or split it
    assert foreign_markers(f"It was '{spaced}'", own, markers) == [other]
    assert foreign_markers(f"{third} and {own}", own, markers) == [third]
    assert shows(f"... {own.lower()}!", own) and not shows(own[:-1], own)


def test_clean_conversations_have_no_leak_and_a_planted_marker_is_flagged() -> None:
    a, b, c = new_markers(3)
    clean = [conversation(a, f"{a}"), conversation(b, "I will remember."), conversation(c, f"Got it: {c}")]
    assert leaks(clean) == []
    in_reply = [conversation(a, a), conversation(b, f"Your code word is {c}."), conversation(c, c)]
    assert len(found := leaks(in_reply)) == 2, found  # the reply and the saved assistant message
    assert all("conversation 1:" in line and f"shows {c} (conversation 2)" in line for line in found), found
    in_history = [*clean[:2], Transcript(c, ["ok"], [{"role": "user", "content": f"My code word is {a}."}])]
    assert leaks(in_history) == [
        f"conversation 2: saved user message 1 shows {a} (conversation 0): 'My code word is {a}.'"
    ]
