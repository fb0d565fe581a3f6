"""The terminal progress bar: drawn on a terminal once work takes a while, silent otherwise."""
import io

from llmd.engine import fetch
from llmd.engine.progress import Progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_bar_is_drawn_on_a_terminal_and_ends_its_line():
    out = Terminal()
    bar = Progress("loading m.gguf", 200_000_000, stream=out, delay=0)
    bar.update(50_000_000)
    bar.update(50_000_001)  # the same picture: not redrawn
    bar.close()
    frames = out.getvalue().split("\r")[1:]
    assert len(frames) == 2 and out.getvalue().endswith("\n")
    assert frames[0] == "llmd: loading m.gguf [######..................]  25%  50/200 MB"
    assert frames[1].startswith("llmd: loading m.gguf [########################] 100%  200/200 MB")


def test_bar_is_silent_off_a_terminal_and_for_quick_work():
    piped = io.StringIO()
    bar = Progress("x", 100, stream=piped, delay=0)
    bar.update(50)
    bar.close()
    quick = Terminal()
    bar = Progress("x", 100, stream=quick, delay=60)
    bar.update(50)
    bar.close()
    assert piped.getvalue() == "" and quick.getvalue() == ""


def test_preload_reads_the_whole_model_quietly_unless_it_takes_a_while(tmp_path, monkeypatch):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"\0" * (20 << 20))
    quick = Terminal()  # a read shorter than the delay (an hour, so that a loaded machine is quick too)
    monkeypatch.setattr(fetch, "Progress", lambda label, total: Progress(label, total, stream=quick, delay=3600))
    fetch.preload(path)
    assert quick.getvalue() == ""
    slow = Terminal()  # as if every read took longer than the delay
    monkeypatch.setattr(fetch, "Progress", lambda label, total: Progress(label, total, stream=slow, delay=0))
    fetch.preload(path)
    frames = slow.getvalue().split("\r")[1:]
    assert frames[0].startswith("llmd: loading m.gguf [#########...............]  40%  8/21 MB")
    assert frames[-1] == "llmd: loading m.gguf [########################] 100%  21/21 MB\n"
