"""Answer metrics: Cover-EM (the paper's headline), EM, token F1, GPQA letter accuracy, answer length.

Normalisation is FlashRAG's `normalize_answer` (`flashrag/evaluator/utils.py`, SQuAD's) by default, character
for character: lower-case, delete every character of `string.punctuation` *without* inserting a space
("Jean-Luc" -> "jeanluc"), replace the articles a/an/the (whole words) with a space, collapse whitespace. Nothing
else: no Unicode normal form, and punctuation outside ASCII (curly quotes, dashes, the ellipsis) is kept, so the
scores are FlashRAG's. Cover-EM is FlashRAG's "acc" (sub-string EM): the normalised gold is a substring of the
normalised response, best over aliases. There is deliberately no word-boundary check, so gold "1" covers "1984"
and gold "art" covers "start": this is the protocol the paper's numbers come from, and it rewards long answers,
which is why answer length is reported beside it.

One departure, on purpose: a gold alias that normalises to "" (NQ holds golds such as "---", ")" and "*") is
never matched. FlashRAG finds "" in every response and scores such a question 1 whatever was answered (and EM 1
for an empty answer). `empty_golds` tells which aliases those are and `has_no_scorable_gold` which questions lost
every alias (they score 0 for every system).

`normalizer="unicode"` (selectable per suite) is a Unicode-aware variant, documented here for comparison and
for writers that use typographic punctuation:
- Punctuation is every character in `string.punctuation` plus every character whose Unicode category is P*
  (curly quotes, en/em dashes, the ellipsis, guillemets, ...): a response quoting "“Rush”" covers "Rush".
- Text is put in NFC (canonical composition: "e" + combining acute == "é"), which never changes what a reader
  sees. NFKC is *not* applied: compatibility folding rewrites characters ("²" -> "2", "ﬁ" -> "fi").
- Accents are kept in both: "Beyonce" does not cover "Beyoncé".
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

ASCII_PUNCTUATION = frozenset(string.punctuation)
ARTICLES = re.compile(r"\b(a|an|the)\b")
LETTERS = "ABCDEFGHIJ"
DEFAULT_NORMALIZER = "flashrag"


def normalize_answer(text: str) -> str:
    """FlashRAG's `normalize_answer`: lower, drop ASCII punctuation, articles to a space, collapse whitespace."""
    text = text.lower()
    text = "".join(char for char in text if char not in ASCII_PUNCTUATION)
    text = ARTICLES.sub(" ", text)
    return " ".join(text.split())


def is_punctuation(char: str) -> bool:
    """The unicode normaliser's punctuation: ASCII `string.punctuation` or any Unicode category P*."""
    return char in ASCII_PUNCTUATION or unicodedata.category(char).startswith("P")


def normalize_answer_unicode(text: str) -> str:
    """FlashRAG's steps on NFC text, with Unicode punctuation (category P*) deleted like ASCII punctuation."""
    text = unicodedata.normalize("NFC", text).lower()
    text = "".join(char for char in text if not is_punctuation(char))
    text = ARTICLES.sub(" ", text)
    return " ".join(text.split())


NORMALIZERS: dict[str, Callable[[str], str]] = {"flashrag": normalize_answer, "unicode": normalize_answer_unicode}


def normalizer_of(name: str) -> Callable[[str], str]:
    if name not in NORMALIZERS:
        from maps_train.errors import ConfigError

        raise ConfigError(f"normalizer: unknown '{name}' (known: {', '.join(NORMALIZERS)})")
    return NORMALIZERS[name]


def _aliases(golden_answers: str | Iterable[str]) -> list[str]:
    return [golden_answers] if isinstance(golden_answers, str) else list(golden_answers)


def scorable_golds(golden_answers: str | Iterable[str], normalizer: str = DEFAULT_NORMALIZER) -> list[str]:
    """The normalised gold aliases that can be matched: those that do not normalise to ""."""
    normalize = normalizer_of(normalizer)
    return [norm for norm in (normalize(gold) for gold in _aliases(golden_answers)) if norm]


def empty_golds(golden_answers: str | Iterable[str], normalizer: str = DEFAULT_NORMALIZER) -> list[str]:
    """The gold aliases that normalise to "" (never matched: FlashRAG would match them in every response)."""
    normalize = normalizer_of(normalizer)
    return [gold for gold in _aliases(golden_answers) if not normalize(gold)]


def has_no_scorable_gold(golden_answers: str | Iterable[str], normalizer: str = DEFAULT_NORMALIZER) -> bool:
    """True when every alias normalises to "": the question scores 0 whatever is answered."""
    return not scorable_golds(golden_answers, normalizer)


def cover_em(response: str, golden_answers: str | Iterable[str], normalizer: str = DEFAULT_NORMALIZER) -> float:
    """1.0 when some normalised gold alias is a substring of the normalised response (no word boundary)."""
    response_norm = normalizer_of(normalizer)(response)
    return 1.0 if any(gold in response_norm for gold in scorable_golds(golden_answers, normalizer)) else 0.0


def exact_match(response: str, golden_answers: str | Iterable[str], normalizer: str = DEFAULT_NORMALIZER) -> float:
    response_norm = normalizer_of(normalizer)(response)
    return 1.0 if any(gold == response_norm for gold in scorable_golds(golden_answers, normalizer)) else 0.0


# FlashRAG's F1 gives no partial credit to yes/no/noanswer answers unless they match exactly.
_CLOSED_ANSWERS = ("yes", "no", "noanswer")


def token_f1(response: str, golden_answers: str | Iterable[str], normalizer: str = DEFAULT_NORMALIZER) -> float:
    """SQuAD token F1 on normalised text (multiset overlap), best over aliases."""
    response_norm = normalizer_of(normalizer)(response)
    response_tokens = response_norm.split()
    best = 0.0
    for gold_norm in scorable_golds(golden_answers, normalizer):
        if (response_norm in _CLOSED_ANSWERS or gold_norm in _CLOSED_ANSWERS) and response_norm != gold_norm:
            continue
        gold_tokens = gold_norm.split()
        overlap = sum((Counter(response_tokens) & Counter(gold_tokens)).values())
        if overlap == 0:
            continue
        precision = overlap / len(response_tokens)
        recall = overlap / len(gold_tokens)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def answer_words(response: str) -> int:
    """Length of the raw response in whitespace-separated words (before normalisation)."""
    return len(response.split())


# --- multiple choice (GPQA) -------------------------------------------------------------------------------------

def _letter_class(num_options: int) -> str:
    last = LETTERS[num_options - 1]
    return f"A-{last}a-{last.lower()}"


def extract_choice(response: str, num_options: int = 4, options: Sequence[str] | None = None) -> str | None:
    """The option letter a response chose ("A".."D"), or None when it names none.

    Tried in order, the last match of each kind winning (models revise themselves mid-answer):
    `\\boxed{B}` (also `\\boxed{\\text{B}}`, `\\boxed{(B)}`); "answer is B" / "Answer: (b)" / "final answer - B";
    a bare letter ("B", "(B)", "b.") as the whole response or at its start ("B) 42 K"); a lone "(B)" anywhere;
    the text of exactly one option (when `options` are given). A lower-case letter after "answer is" counts only
    when nothing else follows it, so "the answer is a bit unclear" chooses nothing.
    """
    text = unicodedata.normalize("NFKC", response).strip()
    letters = _letter_class(num_options)
    upper = LETTERS[:num_options]

    boxed = re.findall(rf"\\boxed\s*\{{\s*(?:\\text(?:bf)?\s*\{{)?\s*\(?([{letters}])\)?\s*\}}?\s*\}}", text)
    if boxed:
        return boxed[-1].upper()

    # "answer" / "is" / "option" in any case; the letter itself upper-case unless nothing follows it.
    stated = re.findall(
        rf"(?i:answer)\s*(?:(?i:is)|:|=|-|–)?\s*[:\-]?\s*(?:(?i:option|choice)\s*)?[*_]*\s*"
        rf"(?:\(([{letters}])\)|([{upper}])\b|([{letters}])[*_]*\s*[.)]?\s*$)",
        text,
    )
    stated_letters = [next(group for group in match if group) for match in stated]
    if stated_letters:
        return stated_letters[-1].upper()

    bare = re.fullmatch(rf"\(?([{letters}])\)?[.:]?", text)
    if bare:
        return bare.group(1).upper()
    leading = re.match(rf"\(?([{upper}])(?:\)|\.|:)\s", text)
    if leading:
        return leading.group(1)
    parenthesised = re.findall(rf"\(([{upper}])\)", text)
    if parenthesised:
        return parenthesised[-1]

    if options:
        response_norm = normalize_answer(text)
        matches = [LETTERS[i] for i, option in enumerate(options) if normalize_answer(option) == response_norm]
        if len(matches) == 1:
            return matches[0]
    return None


def choice_accuracy(response: str, gold_letter: str, num_options: int = 4, options: Sequence[str] | None = None) -> float:
    chosen = extract_choice(response, num_options, options)
    return 1.0 if chosen is not None and chosen == gold_letter.strip().upper() else 0.0


def score_answer(
    response: str,
    golden_answers: Sequence[str],
    answer_mode: str = "short",
    options: Sequence[str] | None = None,
    normalizer: str = DEFAULT_NORMALIZER,
) -> dict:
    """Every metric for one answer. For multiple choice, Cover-EM, EM and F1 all equal letter accuracy.
    `normalizer`: "flashrag" (FlashRAG's normalize_answer, the default) or "unicode" (see the module doc)."""
    response = response or ""
    if answer_mode == "choice":
        num_options = len(options) if options else 4
        chosen = extract_choice(response, num_options, options)
        gold = golden_answers[0].strip().upper() if golden_answers else ""
        correct = 1.0 if chosen is not None and chosen == gold else 0.0
        return {"cover_em": correct, "em": correct, "f1": correct, "choice": chosen, "answer_words": answer_words(response)}
    return {
        "cover_em": cover_em(response, golden_answers, normalizer),
        "em": exact_match(response, golden_answers, normalizer),
        "f1": token_f1(response, golden_answers, normalizer),
        "choice": None,
        "answer_words": answer_words(response),
    }
