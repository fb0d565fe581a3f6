"""Token pieces (bytes) to text: incremental UTF-8 decoding for streaming, and the
hold-back of a tail that may still become a tag.

A byte-level BPE token may end in the middle of a multi-byte character ("é" is
0xC3 0xA9 and the two bytes can arrive in different tokens). `Utf8Stream` holds an
incomplete trailing sequence until the bytes that complete it arrive, so a stream never
emits half a character, and turns bytes that can never form a character into U+FFFD.
"""

from __future__ import annotations

import codecs


class Utf8Stream:
    """Incremental UTF-8 decoder for a stream of token pieces."""

    def __init__(self) -> None:
        # errors="replace": a model may emit invalid byte sequences; the client gets
        # U+FFFD for them instead of the stream failing.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, piece: bytes) -> str:
        """Return the text completed by `piece`; an incomplete trailing sequence is held."""
        return self._decoder.decode(piece, final=False)

    def flush(self) -> str:
        """Return what is still held (an incomplete sequence becomes U+FFFD) and reset."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper start of `tag`: text a
    stream must hold back because the next piece may complete the tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
