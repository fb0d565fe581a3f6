from llmd.prompt.text import Utf8Stream

EURO = "€".encode()   # 3 bytes
EMOJI = "😀".encode()  # 4 bytes


def test_ascii_passes_straight_through():
    s = Utf8Stream()
    assert s.feed(b"Hello") == "Hello"
    assert s.flush() == ""


def test_multi_byte_character_split_across_pieces_is_held_until_complete():
    s = Utf8Stream()
    assert s.feed(b"a" + EMOJI[:1]) == "a"
    assert s.feed(EMOJI[1:2]) == ""
    assert s.feed(EMOJI[2:3]) == ""
    assert s.feed(EMOJI[3:] + b"b") == "😀b"


def test_every_split_point_of_mixed_text_decodes_exactly():
    text = "né € 😀 日本"
    data = text.encode()
    for cut in range(len(data) + 1):
        s = Utf8Stream()
        assert s.feed(data[:cut]) + s.feed(data[cut:]) + s.flush() == text, cut


def test_byte_at_a_time_decodes_exactly():
    s = Utf8Stream()
    out = "".join(s.feed(bytes([b])) for b in (EURO + EMOJI + EURO)) + s.flush()
    assert out == "€😀€"


def test_invalid_byte_becomes_replacement_character_immediately():
    s = Utf8Stream()
    assert s.feed(b"a\xffb") == "a\ufffdb"


def test_broken_sequence_followed_by_ascii_is_replaced():
    s = Utf8Stream()
    assert s.feed(EURO[:2]) == ""
    assert s.feed(b"x") == "\ufffdx"


def test_flush_replaces_an_incomplete_tail_and_resets():
    s = Utf8Stream()
    assert s.feed(b"ok" + EMOJI[:2]) == "ok"
    assert s.flush() == "\ufffd"
    assert s.feed(EURO) == "€"


def test_empty_piece_returns_nothing():
    s = Utf8Stream()
    assert s.feed(b"") == ""
    assert s.feed(EURO[:1]) == ""
    assert s.feed(b"") == ""
    assert s.feed(EURO[1:]) == "€"
