"""A deterministic detector of answers that address the grader instead of the question.

It runs before any request and beside the model's own flag: an answer it flags is still
graded on its content, but the item gains no points until a TA confirms the suggested score.
It looks for the forms seen in practice: instructions to the grader, requests for marks,
text posing as the rubric or as the end of the data, and characters that hide text.
"""
from __future__ import annotations

import re
import unicodedata

_PHRASES = [
    (r"\b(ignore|disregard|forget|override)\b[^.\n]{0,40}\b(instructions?|rubric|criteria|prompt|above|previous)",
     "tells the grader to ignore its instructions"),
    (r"\b(award|give|grant|assign)\b[^.\n]{0,30}\b(full|maximum|max|all|perfect|top)\b[^.\n]{0,15}"
     r"\b(marks?|points?|score|credit)", "asks for marks"),
    (r"\b(full|maximum|perfect)\s+(marks?|points?|score|credit)\b", "asks for marks"),
    (r"\b(you are|act as|as) (an? |the )?(ai|grader|assistant|language model|llm|model|teaching assistant)\b",
     "addresses the grader"),
    (r"\b(system prompt|system message|new instructions?|developer message)\b", "poses as instructions"),
    (r"(^|\n)\s*(rubric|criterion|criteria|grade|score|points)\s*[:=]", "poses as rubric or grade text"),
    (r"\b\d+(\.\d+)?\s*/\s*\d+\s*(points?|marks?)?\s*(awarded|earned|given)\b", "states its own score"),
    (r"(end|begin)\s+(of\s+)?student\s+data|</?\s*(student_data|answer|data|rubric|system)\s*>",
     "imitates the data delimiters"),
    (r"\brecord_grade\b|\binjection_suspected\b|\bneeds_review\b", "names the grading tool"),
]
_PATTERNS = [(re.compile(p, re.IGNORECASE), why) for p, why in _PHRASES]

# Characters that hide or reorder text: zero-width, bidirectional controls, Unicode tags.
_HIDING = re.compile("[\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff\U000e0000-\U000e007f]")


def suspicious(text: str) -> list[str]:
    """Why ``text`` looks like it addresses the grader (empty: it does not)."""
    reasons = []
    if _HIDING.search(text):
        reasons.append("contains invisible or direction-changing characters")
    # Compatibility forms (full-width letters, ligatures) are folded so they cannot hide a phrase.
    folded = unicodedata.normalize("NFKC", _HIDING.sub("", text))
    for pattern, why in _PATTERNS:
        if pattern.search(folded) and why not in reasons:
            reasons.append(why)
    return reasons
