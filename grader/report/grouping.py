"""Answers that say the same thing, grouped so that a TA decides them once (the queue pages).

Answers are compared as tokens: read as the written stage's detector reads text (escapes, hidden
characters and look-alike letters undone), case folded, words kept and so are the symbols that
can change what a claim says (``T > 1024``, ``-0.5``, ``50%``); sentence punctuation, quotes,
brackets and markup (`` ` `` and ``$``, ``*`` and ``_``) are set aside. Three levels, each
measured on families of answers in tests/test_queue_pages.py:

- ``exact``: the same tokens;
- ``near``: word 3-gram shingles sharing at least ``NEAR`` of their union with the group's
  first answer (a word or two changed, a sentence added);
- ``similar``: content words (short function words left out) sharing at least ``SIMILAR`` of
  their union with the group's first answer (the same points in other words or order).

An answer joins the first group whose first answer it is close enough to, never a group
through a chain of others, and only when a page can show how it differs from that first answer
word by word (its ``Change``: every changed word whole, in at most ``MAX_CHANGE_RUNS`` runs and
``MAX_CHANGE_CHARS`` characters with their context): a page that shows a group's first answer and
each member's changes shows every word a member is decided on. An answer whose changes are
longer is tried against the next group, and leads a group of its own if none takes it.
"""
from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from difflib import SequenceMatcher

from grader.written.injection import readable

NEAR = 0.6
SIMILAR = 0.6
MAX_CHANGE_RUNS = 4         # changed runs of one member; more, and it is decided in a row of its own
MAX_CHANGE_CHARS = 400      # one member's changes as its row shows them, context included
CONTEXT_WORDS = 3           # unchanged words shown on either side of a changed run
CONTEXT_CHARS = 30          # a longer unchanged word is cut (the row shows the first answer whole)
# A word (a decimal point, a thousands separator or an apostrophe inside it), a minus sign before
# a number, an ASCII symbol that can change a claim (the ASCII side of ``_counts``, matched here
# because a long answer holds many), or any other character that is not ASCII, a letter, a digit
# or a space (kept or not by ``_counts``).
_TOKENS = re.compile(r"[^\W_]+(?:['.,][^\W_]+)*|-(?=\d)|[<>=+^|~%#&@/\\]|[^\x00-\x7f\w\s]")
_MARKUP = frozenset("`$")                 # symbols (Unicode category S) that only mark up Markdown or LaTeX
_CLAIM_PUNCTUATION = frozenset("%‰#&@/\\")   # punctuation (category P) that says something: 50%, #3, a/b
_FUNCTION_WORDS = frozenset("""a an and are as at be by for from has have in is it its of on or that the their this to
was were which with""".split())

# What a member's changes are, in order: ("same", unchanged words), ("del", the first answer's
# words it does not have), ("ins", its words the first answer does not have), ("gap", "…" for
# unchanged words left out).
Change = tuple[tuple[str, str], ...]


@functools.cache
def _counts(symbol: str) -> bool:
    """Whether a character that is neither a letter nor a digit can change what an answer says."""
    return (unicodedata.category(symbol).startswith("S") and symbol not in _MARKUP) or symbol in _CLAIM_PUNCTUATION


def answer_tokens(plain: str) -> tuple[str, ...]:
    """``plain`` (already read as the detector reads it) as the tokens answers are compared by."""
    return tuple(t for t in _TOKENS.findall(plain.casefold()) if t.isascii() or t[0].isalnum() or _counts(t))


def _shingles(words: tuple[str, ...]) -> frozenset[tuple[str, ...]]:
    return frozenset(words[i:i + 3] for i in range(max(1, len(words) - 2)))


def _jaccard(a: frozenset, b: frozenset) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


@dataclass(frozen=True)
class _Read:
    """An answer as grouping compares it: its words as a page shows them (read as the detector
    reads them, so that hidden text shows), each word's tokens (a word of punctuation alone is
    left out), and what the levels measure."""

    words: tuple[str, ...]
    keys: tuple[tuple[str, ...], ...]
    tokens: tuple[str, ...]
    shingles: frozenset[tuple[str, ...]]
    content: frozenset[str]

    @classmethod
    def of(cls, text: str) -> _Read:
        read = [(word, key) for word in readable(text)[0].split() if (key := answer_tokens(word))]
        tokens = tuple(token for _, key in read for token in key)
        return cls(tuple(word for word, _ in read), tuple(key for _, key in read), tokens, _shingles(tokens),
                   frozenset(t for t in tokens if t not in _FUNCTION_WORDS))


def _context(word: str) -> str:
    return word if len(word) <= CONTEXT_CHARS else word[:CONTEXT_CHARS - 1] + "…"


def _changes(first: _Read, member: _Read) -> Change | None:
    """How ``member``'s words differ from ``first``'s: each changed run whole, ``CONTEXT_WORDS``
    unchanged words on either side and a gap for the rest; None when that is more than a row
    shows (``MAX_CHANGE_RUNS``, ``MAX_CHANGE_CHARS``)."""
    opcodes = SequenceMatcher(None, first.keys, member.keys, autojunk=False).get_opcodes()
    if sum(tag != "equal" for tag, *_ in opcodes) > MAX_CHANGE_RUNS:
        return None
    runs: list[tuple[str, str]] = []
    for index, (tag, i1, i2, j1, j2) in enumerate(opcodes):
        if tag != "equal":
            runs += [("del", " ".join(first.words[i1:i2]))] if i2 > i1 else []
            runs += [("ins", " ".join(member.words[j1:j2]))] if j2 > j1 else []
            continue
        same = [_context(word) for word in member.words[j1:j2]]
        head = same[:CONTEXT_WORDS] if index > 0 else []
        tail = same[-CONTEXT_WORDS:] if index < len(opcodes) - 1 else []
        if len(same) <= len(head) + len(tail):
            runs.append(("same", " ".join(same)))
        else:
            runs += [("same", " ".join(head))] if head else []
            runs.append(("gap", "…"))
            runs += [("same", " ".join(tail))] if tail else []
    if sum(len(text) + 1 for _, text in runs) > MAX_CHANGE_CHARS:
        return None
    return tuple(runs)


@dataclass(frozen=True)
class AnswerGroup:
    """Answers decided together: ``members`` (keys, the first one shown for the group), how
    close they are, the loosest level any member joined at (``single`` for one answer), and
    each member's ``changes`` from the first (empty for the first and for the same tokens)."""

    members: tuple[str, ...]
    kind: str
    changes: tuple[Change, ...]


_LEVELS = ("single", "exact", "near", "similar")


def group_answers(answers: dict[str, str]) -> list[AnswerGroup]:
    """``answers`` (key -> text, in the order to show them) as groups, in the order of their first member."""
    leaders: list[tuple[str, _Read]] = []                   # each group's first answer
    members: dict[str, list[tuple[str, Change]]] = {}
    kinds: dict[str, str] = {}
    for key, text in answers.items():
        read = _Read.of(text)
        joined = None
        for leader, first in leaders:
            if read.tokens == first.tokens:
                joined = (leader, "exact", ())
            elif (level := "near" if _jaccard(read.shingles, first.shingles) >= NEAR else
                  "similar" if _jaccard(read.content, first.content) >= SIMILAR else None):
                changes = _changes(first, read)
                joined = (leader, level, changes) if changes is not None else None
            if joined:
                break
        if joined:
            leader, level, changes = joined
            members[leader].append((key, changes))
            kinds[leader] = max(kinds[leader], level, key=_LEVELS.index)
        else:
            leaders.append((key, read))
            members[key], kinds[key] = [(key, ())], "single"
    return [AnswerGroup(tuple(k for k, _ in members[leader]), kinds[leader], tuple(c for _, c in members[leader]))
            for leader, _ in leaders]
