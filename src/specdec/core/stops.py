"""Stop strings that are exact when a round accepts several tokens at once.

Text arrives in pieces (one per round, from ``detokenize.IncrementalDecoder``); a stop string
may span tokens and rounds. ``StopMatcher`` returns only text that can never become part of a
stop string: it holds back the longest suffix of the text seen so far that is a prefix of some
stop string, until later text shows whether the stop string follows (then the output ends right
before its first occurrence) or not (then the held text is released). So a stream of the
pieces equals ``cut_at_stop(whole text)``: nothing after a stop string, and no partial prefix
of one that later turns out to be a stop string, is ever shown.

Why hold the longest such suffix suffices: if a stop string's first occurrence starts at
position i, then text[i:] (at any moment before the occurrence is complete) is a prefix of that
stop string, so position i is always inside the held suffix and never released.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from specdec.errors import ConfigError

MAX_STOP_CHARS = 1000  # one stop string's length (the hold-back search is quadratic in it)


def check_stops(stops: str | Iterable[str] | None, *, limit: int | None = None) -> tuple[str, ...]:
    """Stop strings as a tuple (a lone string is one stop string), validated: none empty, none
    over ``MAX_STOP_CHARS`` characters, at most ``limit`` of them when a limit is given.
    Duplicates are dropped (order kept)."""
    if stops is None:
        return ()
    items = [stops] if isinstance(stops, str) else list(stops)
    for s in items:
        if not isinstance(s, str):
            raise ConfigError(f"stop strings must be strings, got {type(s).__name__}")
        if not s:
            raise ConfigError("a stop string is empty (it would stop before the first token)")
        if len(s) > MAX_STOP_CHARS:
            raise ConfigError(f"a stop string is longer than {MAX_STOP_CHARS} characters")
        bad = next((i for i, ch in enumerate(s) if 0xD800 <= ord(ch) <= 0xDFFF), None)
        if bad is not None:  # argv bytes that are not UTF-8, or a JSON \udXXX escape
            raise ConfigError(
                f"a stop string is not valid UTF-8 at character {bad}: generated text never "
                "holds it, so it could never match"
            )
    if limit is not None and len(items) > limit:
        raise ConfigError(f"at most {limit} stop strings are allowed, got {len(items)}")
    return tuple(dict.fromkeys(items))


def find_stop(text: str, stops: Sequence[str]) -> int:
    """Index of the first occurrence of any stop string in ``text`` (-1 when none occurs)."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found, default=-1)


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """``text`` up to (not including) the first occurrence of any stop string."""
    i = find_stop(text, stops)
    return text if i < 0 else text[:i]


def held_suffix_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best


class StopMatcher:
    """Feed text pieces with ``push``; it returns the text that is safe to show. ``stopped``
    turns True at the piece where a stop string completes; ``flush`` releases held text when
    the generation ends without one."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self.stopped = False
        self._held = ""  # text seen but not shown: a prefix of some stop string

    def push(self, piece: str) -> str:
        """The new text that is safe to show after ``piece`` ("" once stopped)."""
        if self.stopped:
            return ""
        buf = self._held + piece
        i = find_stop(buf, self.stops)
        if i >= 0:
            self.stopped, self._held = True, ""
            return buf[:i]
        n = held_suffix_len(buf, self.stops)
        self._held = buf[len(buf) - n :] if n else ""
        return buf[: len(buf) - n]

    def flush(self) -> str:
        """Held text, released because no more text will come."""
        out, self._held = ("" if self.stopped else self._held), ""
        return out
