import pytest

from llmd.prompt.stops import StopMatcher


def run(stops, chunks):
    """Feed every chunk; return (chunks emitted per feed, stopped, flushed text)."""
    m = StopMatcher(stops)
    out, stopped = [], False
    for c in chunks:
        text, stopped = m.feed(c)
        out.append(text)
        if stopped:
            break
    return out, stopped, m.flush()


def test_no_stops_passes_text_straight_through():
    assert run([], ["a", "b<", "c"]) == (["a", "b<", "c"], False, "")


def test_stop_inside_one_chunk_cuts_before_it():
    assert run(["END"], ["hello END world"]) == (["hello "], True, "")


def test_partial_stop_string_is_never_streamed():
    stop = "</answer>"
    text = "The result is 42</answer> trailing"
    for size in range(1, len(text) + 1):
        m = StopMatcher([stop])
        streamed = ""
        for i in range(0, len(text), size):
            piece, hit = m.feed(text[i:i + size])
            streamed += piece
            # Nothing streamed so far may end with any non-empty prefix of the stop.
            assert not any(streamed.endswith(stop[:k]) for k in range(1, len(stop) + 1)), (size, streamed)
            if hit:
                break
        assert (streamed, m.stopped, m.flush()) == ("The result is 42", True, ""), size


def test_stop_spanning_many_feeds_is_found():
    out, stopped, rest = run(["<|end|>"], ["a", "<", "|", "e", "n", "d", "|", ">", "zzz"])
    assert ("".join(out), stopped, rest) == ("a", True, "")
    assert out == ["a", "", "", "", "", "", "", ""]


def test_held_back_text_is_released_when_the_stop_does_not_complete():
    m = StopMatcher(["<|end|>"])
    assert m.feed("a<|e") == ("a", False)
    assert m.feed("x") == ("<|ex", False)


def test_flush_releases_held_back_text_at_end_of_generation():
    m = StopMatcher(["STOP"])
    assert m.feed("go ST") == ("go ", False)
    assert m.flush() == "ST"
    assert m.flush() == ""
    assert m.stopped is False


def test_only_the_longest_matching_suffix_is_held():
    m = StopMatcher(["abab"])
    # "xaba": suffixes "aba" and "a" are both prefixes; the longer one is held
    assert m.feed("xaba") == ("x", False)
    assert m.feed("b") == ("", True)


def test_self_overlapping_stop_is_found_after_a_false_start():
    assert run(["aab"], ["a", "a", "a", "b", "c"])[0:2] == (["", "", "a", ""], True)


def test_overlapping_stops_cut_at_the_earliest_start():
    assert run(["bcd", "abc"], ["xabcd"]) == (["x"], True, "")
    m = StopMatcher(["bcd", "abc"])
    m.feed("xabcd")
    assert m.matched == "abc"


def test_earliest_stop_wins_across_a_chunk_boundary():
    m = StopMatcher(["world", "lo"])
    assert m.feed("hel") == ("he", False)
    assert m.feed("lo world") == ("l", True)
    assert m.matched == "lo"


def test_one_stop_being_a_prefix_of_another_stops_at_the_shorter():
    m = StopMatcher(["\n", "\n\n"])
    assert m.feed("line\n\nnext") == ("line", True)
    assert m.matched == "\n"


def test_after_a_stop_everything_is_dropped():
    m = StopMatcher(["#"])
    assert m.feed("a#b") == ("a", True)
    assert m.feed("more text") == ("", True)
    assert m.flush() == ""


def test_stop_at_the_very_start_emits_nothing():
    assert run(["Q:"], ["Q: next"]) == ([""], True, "")


def test_text_that_cannot_start_a_stop_is_not_delayed():
    m = StopMatcher(["###"])
    assert m.feed("hello") == ("hello", False)
    assert m.feed(" world") == (" world", False)


def test_hold_back_is_shorter_than_the_longest_stop():
    m = StopMatcher(["xxxxy"])
    emitted, _ = m.feed("x" * 100)
    assert emitted == "x" * 96
    assert m.feed("y") == ("", True)


def test_empty_feed_changes_nothing():
    m = StopMatcher(["ab"])
    assert m.feed("a") == ("", False)
    assert m.feed("") == ("", False)
    assert m.feed("c") == ("ac", False)


def test_empty_stop_strings_are_ignored():
    assert run([""], ["abc"]) == (["abc"], False, "")


def test_multibyte_characters_in_stop_strings():
    m = StopMatcher(["。終"])
    assert m.feed("日本語。") == ("日本語", False)
    assert m.feed("終わり") == ("", True)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
def test_many_stops_many_sizes_agree_with_a_one_shot_search(size):
    stops = ["</s>", "\nUser:", "STOP", "ss"]
    text = "Some text with </ and \nUse and STO and s then \nUser: hidden"
    out, stopped, rest = run(stops, [text[i:i + size] for i in range(0, len(text), size)])
    assert ("".join(out) + rest, stopped) == ("Some text with </ and \nUse and STO and s then ", True)
