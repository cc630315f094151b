"""Answer metrics on hand-worked cases: FlashRAG's normalisation, Cover-EM, EM, F1, GPQA letters, golds that
normalise to nothing, and the optional Unicode-aware normaliser. The cross-check against a FlashRAG reference on
the real data sets is tests/test_cover_em_flashrag.py."""

from __future__ import annotations

import pytest

from maps_train.errors import ConfigError
from maps_train.records.metrics import (
    answer_words,
    choice_accuracy,
    cover_em,
    empty_golds,
    exact_match,
    extract_choice,
    has_no_scorable_gold,
    normalize_answer,
    normalize_answer_unicode,
    score_answer,
    token_f1,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("Jean-Luc Picard", "jeanluc picard"),  # punctuation deleted, no space inserted (FlashRAG)
        ("  A  cat,   an apple; THE end. ", "cat apple end"),
        ("theater", "theater"),  # articles only as whole words
        ("U.S.A.", "usa"),
        ("$1,000", "1000"),  # string.punctuation holds ASCII symbols too
        ("“Rush” — the band…", "“rush” — band…"),  # FlashRAG: only ASCII punctuation is deleted
        ("1990–1995", "1990–1995"),  # the en dash is not ASCII: kept
        ("«Amélie»", "«amélie»"),
        ("Cafe\u0301", "cafe\u0301"),  # no Unicode normal form
        ("x²", "x²"),
        ("A+", ""),  # "+" deleted, then the article "a" (an NQ gold that normalises to nothing)
        ("", ""),
    ],
)
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Jean-Luc Picard", "jeanluc picard"),
        ("$1,000", "1000"),
        ("“Rush” — the band…", "rush band"),  # curly quotes, em dash, ellipsis are category P*
        ("1990–1995", "19901995"),  # en dash deleted like "-"
        ("«Amélie»", "amélie"),  # accents kept
        ("Cafe\u0301", "café"),  # NFC: combining accent composed
        ("x²", "x²"),  # no NFKC: "²" is not folded to "2"
        ("", ""),
    ],
)
def test_normalize_answer_unicode(text, expected):
    assert normalize_answer_unicode(text) == expected


def test_cover_em_is_substring_without_word_boundary():
    assert cover_em("It was released in 1984.", ["1984"]) == 1.0
    assert cover_em("1984", "1") == 1.0  # FlashRAG-faithful: no word-boundary check
    assert cover_em("the start", "art") == 1.0
    assert cover_em("Jean Luc", "Jean-Luc") == 0.0  # "jeanluc" is not in "jean luc"
    assert cover_em("jeanluc picard", "Jean-Luc") == 1.0
    assert cover_em("The answer is “Rush”.", ["rush"]) == 1.0  # a substring, curly quotes or not
    assert cover_em("Paris", ["London", "Lyon", "paris"]) == 1.0  # best over aliases
    assert cover_em("Paris", ["London", "Lyon"]) == 0.0
    assert cover_em("Beyonce", ["Beyoncé"]) == 0.0  # accents are not stripped


def test_exact_match():
    assert exact_match("The Beatles!", ["beatles"]) == 1.0
    assert exact_match("The Beatles were a band", ["beatles"]) == 0.0
    assert exact_match("Jean–Luc", "jean-luc") == 0.0  # FlashRAG keeps the en dash, deletes the hyphen


def test_the_unicode_normaliser_is_selectable():
    assert exact_match("Jean–Luc", "jean-luc", normalizer="unicode") == 1.0  # en dash and hyphen both deleted
    assert exact_match("“Rush”", ["Rush"]) == 0.0 and exact_match("“Rush”", ["Rush"], normalizer="unicode") == 1.0
    assert cover_em("Café", ["Cafe\u0301"]) == 0.0 and cover_em("Café", ["Cafe\u0301"], normalizer="unicode") == 1.0
    assert score_answer("“Rush”", ["Rush"], normalizer="unicode")["em"] == 1.0
    assert score_answer("“Rush”", ["Rush"])["em"] == 0.0
    with pytest.raises(ConfigError, match="normalizer: unknown 'nfkc'"):
        cover_em("x", ["x"], normalizer="nfkc")


def test_a_gold_that_normalises_to_nothing_is_never_matched():
    # FlashRAG finds "" in every response: these NQ golds would score anything 1 (and EM 1 for an empty answer).
    for gold in ("---", ")", "*", "A+", "the"):
        assert cover_em("anything at all", [gold]) == 0.0 and exact_match("", [gold]) == 0.0
        assert token_f1("", [gold]) == 0.0 and has_no_scorable_gold([gold])
    assert cover_em("blood type AB+", ["A+", "AB+"]) == 1.0  # the other alias still counts
    assert cover_em("O negative", ["A+", "AB+"]) == 0.0
    assert empty_golds(["A+", "AB+"]) == ["A+"] and not has_no_scorable_gold(["A+", "AB+"])
    assert empty_golds(["x", "*"], normalizer="unicode") == ["*"]


def test_token_f1_hand_worked():
    # "the cat sat" -> [cat, sat]; "a cat" -> [cat]: p = 1/2, r = 1/1, F1 = 2/3
    assert token_f1("the cat sat", ["a cat"]) == pytest.approx(2 / 3)
    # best alias: "new york city" vs "new york" -> p = 2/3, r = 1 -> 0.8; vs "nyc" -> 0
    assert token_f1("New York City", ["NYC", "New York"]) == pytest.approx(0.8)
    # multiset overlap: [a, a] is dropped as articles; [b, b, c] vs [b, c, c] overlap b:1, c:1 -> p = r = 2/3
    assert token_f1("b b c", "b c c") == pytest.approx(2 / 3)
    # yes/no get no partial credit (FlashRAG)
    assert token_f1("yes", ["no"]) == 0.0
    assert token_f1("yes it is", ["yes"]) == 0.0  # a yes/no gold must be matched exactly
    assert token_f1("yes it is", ["yes it was"]) == pytest.approx(2 / 3)
    assert token_f1("no", ["no"]) == 1.0
    assert token_f1("", ["x"]) == 0.0


@pytest.mark.parametrize(
    "response, letter",
    [
        ("(B)", "B"),
        ("Answer: B", "B"),
        ("\\boxed{B}", "B"),
        ("so the result is \\boxed{\\text{c}}", "C"),
        ("\\boxed{(D)}", "D"),
        ("the answer is b", "B"),
        ("The correct answer is (a).", "A"),
        ("**Answer:** C", "C"),
        ("Final answer: option D", "D"),
        ("The answer is B. On reflection, the answer is C.", "C"),  # the last statement wins
        ("B", "B"),
        ("c.", "C"),
        ("D) 42 kJ/mol", "D"),
        ("I rule out (A) and (C), leaving (B).", "B"),
        ("Ｂ", "B"),  # full-width letter
        ("The answer is a bit unclear", None),  # an article, not a choice
        ("Answer: Because the field is zero", None),
        ("E", None),  # outside A-D
        ("no idea", None),
    ],
)
def test_extract_choice(response, letter):
    assert extract_choice(response) == letter


def test_extract_choice_by_option_text():
    options = ["12 eV", "3 eV", "7.5 eV", "0 eV"]
    assert extract_choice("7.5 eV", options=options) == "C"
    assert extract_choice("eV", options=options) is None
    assert choice_accuracy("the answer is c", "C") == 1.0
    assert choice_accuracy("(B)", "C") == 0.0


def test_answer_words_and_score_answer():
    assert answer_words("  The Eiffel   Tower, Paris. ") == 4
    # [it, is, eiffel, tower] vs [eiffel, tower]: p = 1/2, r = 1, F1 = 2/3
    short = score_answer("It is the Eiffel Tower.", ["Eiffel Tower"], "short")
    assert short == {"cover_em": 1.0, "em": 0.0, "f1": pytest.approx(2 / 3), "choice": None, "answer_words": 5}
    choice = score_answer("Answer: (C)", ["C"], "choice", ["w", "x", "y", "z"])
    assert choice == {"cover_em": 1.0, "em": 1.0, "f1": 1.0, "choice": "C", "answer_words": 2}
    assert score_answer("", ["C"], "choice")["cover_em"] == 0.0
