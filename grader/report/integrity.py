"""Near-identical submissions, listed for a person to look at; nothing is penalized.

Scaffold code is compared as a token stream with comments, whitespace and names normalized
(each identifier becomes ``v0, v1, ...`` in order of first use; every string, docstrings
included, becomes one token; keywords, attributes and numbers stay), so renaming variables,
rewording docstrings or reformatting does not hide a copy. A submission
whose code is still (nearly) the template's is left out, or every untouched notebook would
pair with every other. Written answers are compared as lowercased words, and only answers
long enough to carry an argument.
"""
from __future__ import annotations

import io
import json
import keyword
import tokenize
from dataclasses import dataclass
from difflib import SequenceMatcher
from itertools import combinations
from pathlib import Path

from grader.pipeline import SCAFFOLD_SOURCE
from grader.score import GradeResult
from grader.written import WRITTEN_INPUTS

CODE_THRESHOLD = 0.95     # SequenceMatcher ratio on normalized tokens
ANSWER_THRESHOLD = 0.90   # ratio on words
MIN_ANSWER_WORDS = 12


@dataclass(frozen=True)
class SimilarPair:
    first: str
    second: str
    what: str          # "scaffold code" or "written answer <id>"
    similarity: float


def code_tokens(source: str) -> list[str]:
    """``source`` as tokens with identifiers renamed by first use; [] when it does not tokenize."""
    names: dict[str, str] = {}
    found: list[str] = []
    previous = ""
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                              tokenize.DEDENT, tokenize.ENDMARKER):
                continue
            text = token.string
            if token.type == tokenize.NAME and not keyword.iskeyword(text) and previous != ".":
                text = names.setdefault(text, f"v{len(names)}")
            elif token.type == tokenize.STRING:
                text = "STRING"
            found.append(text)
            previous = token.string
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []
    return found


def answer_words(text: str) -> list[str]:
    return "".join(ch.lower() if ch.isalnum() else " " for ch in text).split()


def similarity(a: list[str], b: list[str]) -> float:
    matcher = SequenceMatcher(None, a, b, autojunk=False)
    if matcher.real_quick_ratio() < min(CODE_THRESHOLD, ANSWER_THRESHOLD) or matcher.quick_ratio() < 0.85:
        return 0.0   # cheap upper bounds first: most pairs are far apart
    return matcher.ratio()


def similar_pairs(out_dir: Path, results: list[GradeResult], template_scaffold: str | None = None) -> list[SimilarPair]:
    """Pairs of submissions whose scaffold code or a written answer is near-identical."""
    template = code_tokens(template_scaffold) if template_scaffold else []
    code: dict[str, list[str]] = {}
    answers: dict[str, dict[str, list[str]]] = {}
    for result in results:
        folder = out_dir / result.submission_id
        try:
            tokens = code_tokens((folder / SCAFFOLD_SOURCE).read_text())
        except OSError:
            tokens = []
        if tokens and not (template and SequenceMatcher(None, tokens, template, autojunk=False).ratio() >= CODE_THRESHOLD):
            code[result.submission_id] = tokens
        try:
            written = json.loads((folder / WRITTEN_INPUTS).read_text()).get("answers") or {}
        except (OSError, ValueError, AttributeError):
            written = {}
        answers[result.submission_id] = {qid: words for qid, text in written.items()
                                         for words in [answer_words(str(text))] if len(words) >= MIN_ANSWER_WORDS}
    pairs = []
    for first, second in combinations(sorted(answers), 2):
        if first in code and second in code:
            ratio = similarity(code[first], code[second])
            if ratio >= CODE_THRESHOLD:
                pairs.append(SimilarPair(first, second, "scaffold code", round(ratio, 3)))
        for qid in sorted(set(answers[first]) & set(answers[second])):
            ratio = similarity(answers[first][qid], answers[second][qid])
            if ratio >= ANSWER_THRESHOLD:
                pairs.append(SimilarPair(first, second, f"written answer {qid}", round(ratio, 3)))
    return sorted(pairs, key=lambda p: -p.similarity)
