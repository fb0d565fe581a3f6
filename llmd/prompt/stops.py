"""Stop strings on streamed text, with a hold-back so no partial stop string is streamed.

Theory of operation: decoded text arrives in arbitrary chunks (one token's worth, often
less than one word). `feed` appends a chunk to the pending text and
- if any stop string now occurs, returns everything before the earliest occurrence and
  reports the hit; the stop string and all text after it are dropped for good;
- otherwise returns the pending text minus its longest suffix that is a prefix of some
  stop string. That suffix is held back: it might be the start of a stop string that the
  next chunk completes. A held-back suffix is always shorter than the longest stop
  string, so at most that many characters are delayed.
`flush` releases the held-back text when generation ends without a stop.
"""

from __future__ import annotations

from typing import Sequence


class StopMatcher:
    """Streams text up to (not including) the first occurrence of any stop string."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]  # "" would match everywhere; validation refuses it
        self.matched: str | None = None       # the stop string that ended the text, if any
        self._pending = ""

    @property
    def stopped(self) -> bool:
        return self.matched is not None

    def feed(self, text: str) -> tuple[str, bool]:
        """Return (text safe to emit now, whether a stop string was hit).

        After a hit every later call returns ("", True)."""
        if self.matched is not None:
            return "", True
        buf = self._pending + text
        if not self.stops:
            self._pending = ""
            return buf, False
        # The earliest start wins, so of overlapping stops ("abc", "bc") the one that
        # begins first cuts the text; at equal starts any choice cuts at the same place.
        cut, hit = -1, None
        for s in self.stops:
            i = buf.find(s)
            if i != -1 and (cut == -1 or i < cut or (i == cut and len(s) < len(hit))):
                cut, hit = i, s
        if hit is not None:
            self.matched = hit
            self._pending = ""
            return buf[:cut], True
        hold = self._held_back_length(buf)
        self._pending = buf[len(buf) - hold:]
        return buf[:len(buf) - hold], False

    def flush(self) -> str:
        """Return the held-back text (end of generation without a stop) and clear it."""
        rest, self._pending = self._pending, ""
        return "" if self.matched is not None else rest

    def _held_back_length(self, buf: str) -> int:
        # Longest suffix of buf that is a proper prefix of a stop string (a whole stop
        # string would have been found above).
        longest = max(len(s) for s in self.stops) - 1
        for k in range(min(longest, len(buf)), 0, -1):
            tail = buf[-k:]
            if any(s.startswith(tail) for s in self.stops):
                return k
        return 0
