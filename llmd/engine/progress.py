"""A one-line progress bar on a terminal, for work that may take a while.

It draws nothing when the stream is not a terminal (a service's journal, a pipe,
a test) and nothing for work that ends within `delay` seconds, so fast cases stay
quiet; once drawn, it ends with its own line break.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 24  # characters of bar


class Progress:
    def __init__(self, label: str, total: int, *, stream: TextIO | None = None, delay: float = 0.5):
        self.label, self.total = label, max(total, 1)
        self.stream = stream if stream is not None else sys.stderr
        self.live = self.stream.isatty()
        self.started = time.monotonic()
        self.delay = delay
        self.drawn = ""

    def update(self, done: int) -> None:
        if not self.live or time.monotonic() - self.started < self.delay:
            return
        filled = min(done * WIDTH // self.total, WIDTH)
        line = (f"\rllmd: {self.label} [{'#' * filled}{'.' * (WIDTH - filled)}] "
                f"{min(done * 100 // self.total, 100):3d}%  {done / 1e6:.0f}/{self.total / 1e6:.0f} MB")
        if line != self.drawn:  # redraw only when something visible changed
            self.stream.write(line)
            self.stream.flush()
            self.drawn = line

    def close(self) -> None:
        if self.drawn:
            self.update(self.total)
            self.stream.write("\n")
            self.stream.flush()
