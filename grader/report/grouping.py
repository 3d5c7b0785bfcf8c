"""Answers that say the same thing, grouped so that a TA decides them once (the queue pages).

Three levels, each measured on families of answers in tests/test_queue_pages.py:

- ``exact``: equal once read as the written stage's detector reads text (escapes, hidden
  characters and look-alike letters undone), case, punctuation and spacing ignored;
- ``near``: word 3-gram shingles sharing at least ``NEAR`` of their union with the group's
  first answer (a word or two changed, a sentence added);
- ``similar``: content words (short function words left out) sharing at least ``SIMILAR`` of
  their union with the group's first answer (the same points in other words or order).

An answer joins the first group whose first answer it is close enough to, never a group
through a chain of others, so a group's members are each close to the one shown for it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from grader.written.injection import readable

NEAR = 0.6
SIMILAR = 0.6
_WORDS = re.compile(r"[^\W_]+(?:['.][^\W_]+)*")
_FUNCTION_WORDS = frozenset("""a an and are as at be by for from has have in is it its of on or that the their this to
was were which with""".split())


def normalized(text: str) -> str:
    """The answer as its words alone: read as a model reads it, lower case, one space between words."""
    return " ".join(_WORDS.findall(readable(text)[0].casefold()))


def _shingles(words: list[str]) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + 3]) for i in range(max(1, len(words) - 2))}


def _jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


@dataclass(frozen=True)
class AnswerGroup:
    """Answers decided together: ``members`` (keys, the first one shown for the group) and how
    close they are, the loosest level any member joined at (``single`` for one answer)."""

    members: tuple[str, ...]
    kind: str


_LEVELS = ("single", "exact", "near", "similar")


def group_answers(answers: dict[str, str]) -> list[AnswerGroup]:
    """``answers`` (key -> text, in the order to show them) as groups, in the order of their first member."""
    leaders: list[tuple[str, set, set]] = []          # (key, shingles, content words) of each group's first answer
    members: dict[str, list[str]] = {}
    kinds: dict[str, str] = {}
    exact: dict[str, str] = {}                        # normalized text -> its group's leader
    for key, text in answers.items():
        plain = normalized(text)
        if plain in exact:
            leader = exact[plain]
            members[leader].append(key)
            kinds[leader] = max(kinds[leader], "exact", key=_LEVELS.index)
            continue
        words = plain.split()
        shingles, content = _shingles(words), {w for w in words if w not in _FUNCTION_WORDS}
        joined = None
        for leader, leader_shingles, leader_content in leaders:
            if _jaccard(shingles, leader_shingles) >= NEAR:
                joined = (leader, "near")
            elif _jaccard(content, leader_content) >= SIMILAR:
                joined = (leader, "similar")
            if joined:
                break
        if joined:
            leader, level = joined
            members[leader].append(key)
            kinds[leader] = max(kinds[leader], level, key=_LEVELS.index)
        else:
            leaders.append((key, shingles, content))
            members[key], kinds[key] = [key], "single"
        exact[plain] = joined[0] if joined else key
    return [AnswerGroup(tuple(members[leader]), kinds[leader]) for leader, _, _ in leaders]
