"""Incremental detokenization and stop strings: the text a stream releases, delta by delta, is the
text of the whole output, with no half characters and nothing past a stop string."""
from __future__ import annotations

import pytest

from raypd.cluster.openai.detokenizer import IncrementalDetokenizer
from raypd.cluster.openai.stop import StopMatcher

TEXTS = [
    "Héllo wörld! 你好，世界。 Emoji: 🚀🎉👩‍👩‍👧 done.",
    "It's \"quoted\" , ok . Ünïcödé ⟨ math ⟩ ∑ x² — dash",
    "plain ascii text with  double  spaces\nand\ttabs",
]


@pytest.fixture(scope="module")
def hf():
    from raypd.engine.model.source import resolve_model
    from raypd.engine.tokenizer import Tokenizer

    return Tokenizer(resolve_model(None)).hf


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("step", [1, 2, 3])
def test_deltas_join_to_the_full_decode(hf, text, step):
    ids = hf.encode(text, add_special_tokens=False)
    d = IncrementalDetokenizer(hf)
    deltas = [d.add(ids[i:i + step]) for i in range(0, len(ids), step)] + [d.flush()]
    assert "".join(deltas) == hf.decode(ids) == text
    assert not any("\ufffd" in x for x in deltas)  # never half a multi-byte character


def test_special_tokens_are_skipped(hf):
    ids = hf.encode("Hi there", add_special_tokens=False) + [hf.eos_token_id]
    d = IncrementalDetokenizer(hf)
    assert "".join(d.add([i]) for i in ids) + d.flush() == "Hi there"


def release(stops, deltas):
    m = StopMatcher(stops)
    out = [m.feed(x) for x in deltas]
    return out, m


def test_stop_string_split_over_deltas_is_held_back_then_cut():
    out, m = release(["STOP"], ["abc S", "T", "OP tail"])
    assert out == ["abc ", "", ""] and m.stopped


def test_partial_match_that_does_not_complete_is_released():
    out, m = release(["STOP"], ["abc ST", "x"])
    assert out == ["abc ", "STx"] and not m.stopped
    out, m = release(["STOP"], ["abc ST"])
    assert m.flush() == "ST"  # at the end the held tail is plain text


def test_earliest_of_several_stop_strings_wins():
    out, m = release(["world", "lo w"], ["hello world"])
    assert out == ["hel"] and m.stopped


def test_no_stop_strings_pass_through():
    out, m = release([], ["a", "b"])
    assert out == ["a", "b"] and m.flush() == ""


def test_overlapping_prefixes_hold_the_longest_candidate():
    # "aab" can start at the second "a" of "aa": holding only "a" would leak text before the match.
    out, m = release(["aab"], ["xaa", "b!"])
    assert "".join(out) == "x" and m.stopped
