"""Near-identical submissions, listed for a person to look at; nothing is penalized.

Scaffold code is compared as a token stream with comments, whitespace and names normalized
(each identifier becomes ``v0, v1, ...`` in order of first use; every string, docstrings
included, becomes one token; keywords, attributes and numbers stay), so renaming variables,
rewording docstrings or reformatting does not hide a copy. A submission
whose code is still (nearly) the template's is left out, or every untouched notebook would
pair with every other. Written answers are compared as lowercased words, and only answers
long enough to carry an argument.

Submissions are listed in groups, not pairs: those linked by near-identical texts (one link
is enough, so a chain of copies is one group), with the lowest similarity of the links. A
ring of ten copies is one row for a TA, not forty-five, and identical texts are compared
once however many submissions share them.
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
class SimilarGroup:
    members: tuple[str, ...]   # submission ids, sorted
    what: str                  # "scaffold code" or "written answer <id>"
    similarity: float          # the lowest similarity of the links that make the group


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
    if a == b:
        return 1.0   # copies of one text (a class's untouched answers) cost no matching
    matcher = SequenceMatcher(None, a, b, autojunk=False)
    if matcher.real_quick_ratio() < min(CODE_THRESHOLD, ANSWER_THRESHOLD) or matcher.quick_ratio() < 0.85:
        return 0.0   # cheap upper bounds first: most pairs are far apart
    return matcher.ratio()


def similar_groups(out_dir: Path, results: list[GradeResult],
                   template_scaffold: str | None = None) -> list[SimilarGroup]:
    """Groups of submissions whose scaffold code or a written answer is near-identical, the
    closest first."""
    template = code_tokens(template_scaffold) if template_scaffold else []
    code: dict[str, list[str]] = {}
    answers: dict[str, dict[str, list[str]]] = {}
    for result in results:
        folder = out_dir / result.submission_id
        try:
            tokens = code_tokens((folder / SCAFFOLD_SOURCE).read_text())
        except OSError:
            tokens = []
        if tokens and not (template and similarity(tokens, template) >= CODE_THRESHOLD):
            code[result.submission_id] = tokens
        try:
            written = json.loads((folder / WRITTEN_INPUTS).read_text()).get("answers") or {}
        except (OSError, ValueError, AttributeError):
            written = {}
        answers[result.submission_id] = {qid: words for qid, text in written.items()
                                         for words in [answer_words(str(text))] if len(words) >= MIN_ANSWER_WORDS}
    groups = _linked(code, "scaffold code", CODE_THRESHOLD)
    for qid in sorted({qid for found in answers.values() for qid in found}):
        texts = {sid: found[qid] for sid, found in answers.items() if qid in found}
        groups += _linked(texts, f"written answer {qid}", ANSWER_THRESHOLD)
    return sorted(groups, key=lambda g: (-g.similarity, g.members, g.what))


def _linked(texts: dict[str, list[str]], what: str, threshold: float) -> list[SimilarGroup]:
    """The groups of submissions whose texts link at ``threshold`` or more (single linkage)."""
    sharing: dict[tuple[str, ...], list[str]] = {}
    for sid in sorted(texts):
        sharing.setdefault(tuple(texts[sid]), []).append(sid)
    distinct = list(sharing)
    root = list(range(len(distinct)))
    lowest = [1.0] * len(distinct)   # per group root; copies of one text are alike

    def find(i: int) -> int:
        while root[i] != i:
            root[i] = root[root[i]]
            i = root[i]
        return i

    for i, j in combinations(range(len(distinct)), 2):
        a, b = find(i), find(j)
        if a == b:
            continue   # already linked: another link would not change the group
        ratio = similarity(list(distinct[i]), list(distinct[j]))
        if ratio >= threshold:
            root[b] = a
            lowest[a] = min(lowest[a], lowest[b], ratio)
    members: dict[int, list[str]] = {}
    for i, text in enumerate(distinct):
        members.setdefault(find(i), []).extend(sharing[text])
    return [SimilarGroup(tuple(sorted(ids)), what, round(lowest[r], 3)) for r, ids in members.items() if len(ids) > 1]
