"""Similarity across a class: copied code and copied written answers, for a person to look at.

``grader grade`` runs it once every submission is graded (``--similarity off`` skips it) and
writes ``DIR/similarity.json``, which the pages show (``grader.report.pages``: the TA page
``DIR/similarity.html`` and the class summary's groups, ``flagged_groups``). It reads only what
a graded folder keeps: each submission's ``scaffold.py`` (the code the student owns: scaffold cells, exercise
functions, package files) and ``written_inputs.json`` (the answers, question by question), so an
earlier term's graded folders (``--compare-with``) are sources too, never paired among themselves.
It changes no score and no other file; a failure here is reported and the grades stand. The
file records a digest of everything the comparison read (``inputs_digest``): a run whose inputs
are unchanged, such as a regrade that changed nothing, keeps the file as it is.

Two kinds of comparison, every pair at or above a reporting floor listed, ``flagged`` above a
threshold calibrated on tests/similarity/calibration and measured on tests/similarity/heldout
(docs/similarity.md has the figures):

- ``code``: each side's code is first brought to a canonical form with Python's ``ast``
  (docstrings, comments, ``pass`` and ``if False:`` blocks and stores to names nothing reads
  dropped; ``x += y`` as ``x = x + y``; the operands of commutative operators, ``>`` and ``>=``,
  and the definitions of a module or class put in an order that ignores names; ``matmul`` and
  ``pow`` calls as operators, ``x.exp()`` as ``torch.exp(x)``), then fingerprinted by copydetect
  (its tokenizer puts one placeholder for every name, so renames are invisible; every k-gram of
  the filtered text is kept), with the template's scaffold and the master's provided code removed
  as boilerplate. A side's share is the filtered code its k-grams cover that the other side's
  k-grams cover too, over all its k-grams cover (copydetect's measure); a pair's score is the
  larger share, so code padded with dead code or comments still matches the code it copied. A
  side with little code of its own is not compared, and a pair must share at least
  ``MIN_SHARED_CODE`` filtered characters to be flagged, so that short idioms every solution
  writes alike are not. Identical code is compared once, however many submissions share it.
- ``written``: each answer, read as the queue reads it (hidden characters undone, case folded,
  ``grouping``'s tokens), as word 3-grams, less those of the question's own text and of the
  template's placeholder; the score is the share of the smaller answer's 3-grams the other holds.
  Across languages, the language-independent tokens (numbers, single letters and symbols,
  formula words) are compared the same way, as 3-grams of their sequence
  (``anchor``), which a translation keeps; a pair is flagged on either. A question's answers are
  compared all at once, as one matrix product of the 3-grams they hold.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import json
import sys
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from itertools import chain, combinations, product
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from grader import cells, digests
from grader.assignment import Assignment
from grader.intake import SAFE_ID
from grader.pipeline import SCAFFOLD_SOURCE
from grader.report.executed import cut
from grader.report.grouping import answer_tokens   # the queue's tokens: one reading of an answer
from grader.report.plots import matplotlib_module
from grader.score import GradeResult
from grader.untrusted import read_bytes
from grader.written import WRITTEN_INPUTS
from grader.written.injection import readable

SIMILARITY_FILE = "similarity.json"
MAX_SOURCE_BYTES = 4 * 2**20        # a kept scaffold.py or written_inputs.json read for comparison

# Code (calibrated on tests/similarity/calibration; see docs/similarity.md).
CODE_K = 20                  # characters of copydetect's filtered text in one fingerprint
MIN_OWN_CODE = 200           # filtered characters of a side's own code (boilerplate aside) to be compared
MIN_SHARED_CODE = 350        # filtered characters two sides share, at least, to be flagged
CODE_FLOOR = 0.5             # a pair at or above this is listed
CODE_THRESHOLD = 0.65        # and flagged above this
# Written answers (calibrated likewise).
WORDS_K = 3                  # words in one shingle
MIN_SHINGLES = 8             # an answer's own shingles (the question's aside) to be compared
ANCHORS_K = 3
MIN_ANCHOR_SHINGLES = 6      # anchor 3-grams an answer needs to be compared across languages
WRITTEN_FLOOR = 0.25
WRITTEN_THRESHOLD = 0.35
ANCHOR_THRESHOLD = 0.65
# What similarity.json keeps, whatever submissions hold (the page shows at most this much).
MAX_PASSAGE_PAIRS = 500      # the highest pairs that keep their passages in similarity.json
MAX_PASSAGES = 3             # passages kept per pair
MAX_PASSAGE_CHARS = 800      # characters of one side of a passage
MAX_RECORD_BYTES = 64 * 2**20   # similarity.json as the pages read it back

# Tensor methods that are also torch functions: ``x.exp()`` is read as ``torch.exp(x)``.
_TENSOR_FUNCTIONS = frozenset("""abs clamp cumprod cumsum exp flip log mean relu sigmoid softmax sqrt squeeze
sum transpose tril triu unsqueeze""".split())
_MATMUL = frozenset(("matmul", "mm", "bmm"))
_COMMUTATIVE = (ast.Add, ast.Mult, ast.BitAnd, ast.BitOr, ast.BitXor)
_MIRRORED = {ast.Gt: ast.Lt, ast.GtE: ast.LtE}
# Words that write a formula the same in every language the course reads.
_FORMULA_WORDS = frozenset("""alpha beta gamma lambda phi sigma softmax exp log sqrt elu relu fft ifft tril triu
kv qk einsum""".split())


@dataclass(frozen=True)
class Source:
    """One submission's code and answers as compared; ``earlier``: from ``--compare-with``."""

    id: str
    code: str
    answers: dict[str, str]
    earlier: bool = False


@dataclass(frozen=True)
class Passage:
    """One matching passage: each side's text (canonical code, or the answer), cut for the page."""

    a: str
    b: str


@dataclass
class Pair:
    """Two sources found alike: ``kind`` is code or written (``question`` says which), ``score``
    in [0, 1], ``how`` what matched (code, words or anchors)."""

    a: str
    b: str
    kind: str
    score: float
    flagged: bool
    question: str = ""
    how: str = ""
    shared: int = 0
    passages: list[Passage] = field(default_factory=list)


@dataclass(frozen=True)
class Boilerplate:
    """What every submission holds because it was handed out: the template's scaffold code with
    the master's provided code, and per question the question's text and the template's answer."""

    code: str = ""
    questions: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, assignment: Assignment) -> Boilerplate:
        """The boilerplate of ``assignment`` (its template and master notebooks)."""
        handed = [cells.source(c) for c in assignment.template.cells if cells.SCAFFOLD in cells.tags(c)]
        handed += [cells.source(c) for c in assignment.master.cells if cells.PROVIDED in cells.tags(c)]
        placeholders = {qid: parsed.answer for cell in assignment.template.cells
                        if (qid := cells.question_id(cell)) and (parsed := cells.parse_written_answer(cell))}
        questions = {qid: f"{parsed.question}\n{placeholders.get(qid, '')}"
                     for qid, parsed in assignment.reference_answers.items()}
        return cls("\n\n".join(handed), questions)


# ---- code ----------------------------------------------------------------------------------


class _Canonical(ast.NodeTransformer):
    """The rewrites listed in the module's docstring; ``loaded``: every name the code reads."""

    def __init__(self, loaded: set[str]) -> None:
        self.loaded = loaded
        self.shapes: dict[int, tuple[ast.AST, str]] = {}   # id -> (the node, kept alive so no id is reused; its shape)

    def _shape(self, node: ast.AST) -> str:
        """``node``'s tree of node kinds, names and values left out: an order for operands and
        definitions that renaming keeps. Drawn once per node (the tree below a visited node is final)."""
        kept = self.shapes.get(id(node))
        if kept is None or kept[0] is not node:
            kept = (node, f"{type(node).__name__}({' '.join(map(self._shape, ast.iter_child_nodes(node)))})")
            self.shapes[id(node)] = kept
        return kept[1]

    def _body(self, body: list[ast.stmt]) -> list[ast.stmt]:
        kept: list[ast.stmt] = []
        for statement in body:
            if isinstance(statement, ast.Pass) or (isinstance(statement, ast.Expr)
                                                   and isinstance(statement.value, ast.Constant)):
                continue   # docstrings and other bare literals
            if isinstance(statement, ast.If) and isinstance(statement.test, ast.Constant) and not statement.test.value:
                kept += self._body(statement.orelse)
                continue
            if isinstance(statement, (ast.Assign, ast.AnnAssign)) and all(
                    isinstance(t, ast.Name) and t.id not in self.loaded
                    for t in (statement.targets if isinstance(statement, ast.Assign) else [statement.target])):
                continue   # a store nothing reads
            kept.append(statement)
        definitions = sorted((s for s in kept if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))),
                             key=self._shape)
        return [definitions.pop(0) if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else s
                for s in kept] or [ast.Pass()]

    def generic_visit(self, node: ast.AST) -> ast.AST:
        node = super().generic_visit(node)
        for name in ("body", "orelse", "finalbody"):
            value = getattr(node, name, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                setattr(node, name, self._body(value))
        return node

    def visit_AugAssign(self, node: ast.AugAssign) -> ast.AST:
        read = ast.parse(ast.unparse(node.target), mode="eval").body
        return self.visit(ast.Assign(targets=[node.target], value=ast.BinOp(read, node.op, node.value), lineno=0))

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        node = self.generic_visit(node)
        if isinstance(node.op, _COMMUTATIVE):
            node.left, node.right = sorted((node.left, node.right), key=self._shape)
        return node

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        node = self.generic_visit(node)
        if len(node.ops) == 1 and type(node.ops[0]) in _MIRRORED:
            node = ast.Compare(node.comparators[0], [_MIRRORED[type(node.ops[0])]()], [node.left])
        if len(node.ops) == 1 and isinstance(node.ops[0], (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)):
            node.left, node.comparators[0] = sorted((node.left, node.comparators[0]), key=self._shape)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        node = self.generic_visit(node)
        function = node.func
        if not isinstance(function, ast.Attribute):
            return node
        module = isinstance(function.value, ast.Name) and function.value.id in ("torch", "F", "np", "math")
        operands = node.args if module else [function.value, *node.args]
        if function.attr in _MATMUL and len(operands) == 2 and not node.keywords:
            return ast.BinOp(operands[0], ast.MatMult(), operands[1])
        if function.attr == "pow" and len(operands) == 2 and not node.keywords:
            return ast.BinOp(operands[0], ast.Pow(), operands[1])
        if not module and function.attr in _TENSOR_FUNCTIONS:
            return ast.Call(ast.Attribute(ast.Name("torch", ast.Load()), function.attr, ast.Load()), operands,
                            node.keywords)
        return node


def canonical_code(source: str) -> str:
    """``source`` in the canonical form the module's docstring describes; as given when it does
    not parse (copydetect's tokenizer still reads it, comments and all)."""
    try:
        tree = cells.parse_python(source)
        loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)}
        return ast.unparse(ast.fix_missing_locations(_Canonical(loaded).visit(tree)))
    except (SyntaxError, RecursionError, ValueError, TypeError):
        return source


@functools.cache
def _copydetect() -> ModuleType:
    """copydetect's ``utils``, imported when code is first compared: its package imports
    matplotlib.pyplot, whose font cache goes where the pages keep matplotlib's (a temporary
    folder), never in ~/.cache."""
    matplotlib_module()
    import copydetect.utils
    return copydetect.utils


@dataclass(frozen=True)
class _Code:
    """One side's code as compared: the canonical code, copydetect's filtered text's offsets
    (filtered position -> characters removed before it), the hash of the k-gram at each filtered
    position, which of them are the side's own (not boilerplate), their distinct hashes, sorted,
    and how many filtered characters the own k-grams cover."""

    raw: str
    offsets: np.ndarray
    grams: np.ndarray
    own: np.ndarray
    kinds: np.ndarray
    covered: int

    @classmethod
    def of(cls, code: str, boilerplate: np.ndarray) -> _Code:
        """``code`` (canonical already) read by copydetect's tokenizer (names as one placeholder)
        and hashed as copydetect does, every k-gram kept: winnowing picks by Python's string hash,
        which changes from one process to the next, and a pair's score would change with it."""
        utils = _copydetect()
        filtered, offsets = utils.filter_code(code, "code.py", "python")
        grams = np.asarray(utils.hashed_kgrams(filtered, CODE_K), dtype=np.int64)
        own = ~np.isin(grams, boilerplate)
        return cls(code, offsets, grams, own, np.unique(grams[own]), int(_cover(own).sum()))


def _cover(starts: np.ndarray) -> np.ndarray:
    """Which filtered characters the k-grams starting where ``starts`` is True cover."""
    length = len(starts) + CODE_K - 1 if len(starts) else 0
    begin = np.flatnonzero(starts)
    edges = np.bincount(begin, minlength=length + 1) - np.bincount(begin + CODE_K, minlength=length + 1)
    return np.cumsum(edges)[:length] > 0


def _runs(covered: np.ndarray) -> list[tuple[int, int]]:
    """The [start, end) runs of True in ``covered``, the longest first."""
    edges = np.diff(np.concatenate(([0], covered.astype(np.int8), [0])))
    return sorted(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()),
                  key=lambda run: run[0] - run[1])


def _raw(code: _Code, position: int) -> int:
    """A position in the filtered text as one in the code (copydetect's own mapping)."""
    if not len(code.offsets):
        return position
    at = min(int(np.searchsorted(code.offsets[:, 0], position)), code.offsets.shape[0] - 1)
    return position + int(code.offsets[at, 1])


def _code_passages(a: _Code, b: _Code, shared_a: np.ndarray, shared_b: np.ndarray) -> list[Passage]:
    """The longest runs of ``a``'s code that ``b`` holds, each beside the run of ``b`` it matched
    (found through the first k-gram of the run)."""
    runs_b = _runs(_cover(shared_b))
    passages = []
    for start, end in _runs(_cover(shared_a))[:MAX_PASSAGES]:
        first = a.grams[start + int(np.argmax(shared_a[start:end]))]
        there = int(np.argmax(shared_b & (b.grams == first)))
        run = next(((s, e) for s, e in runs_b if s <= there < e), None)
        if run is not None:
            passages.append(Passage(_lines(a, start, end), _lines(b, *run)))
    return passages


def _lines(code: _Code, start: int, end: int) -> str:
    """The whole lines of ``code`` that filtered positions [start, end) fall in, cut for the page."""
    first, last = _raw(code, start), _raw(code, end)
    first = code.raw.rfind("\n", 0, first) + 1
    last = len(code.raw) if (found := code.raw.find("\n", last)) < 0 else found
    return cut(code.raw[first:last].strip("\n"), MAX_PASSAGE_CHARS, SCAFFOLD_SOURCE)


def code_pairs(sources: Sequence[Source], boilerplate: str = "") -> list[Pair]:
    """Every pair of ``sources`` whose code scores at or above ``CODE_FLOOR`` (two earlier sources
    are never a pair), flagged above ``CODE_THRESHOLD`` when they share ``MIN_SHARED_CODE``: a
    side's share is the filtered characters covered by k-grams the other side has too, over those
    its own k-grams cover (copydetect's measure), and the pair's score the larger share."""
    handed = _Code.of(canonical_code(boilerplate), np.empty(0, np.int64)).kinds if boilerplate.strip() else np.empty(0)
    # One reading per distinct canonical code: copies of one text (a ring, or untouched notebooks) are compared once.
    texts: dict[str, list[Source]] = {}
    for source in sources:
        if source.code.strip():
            texts.setdefault(canonical_code(source.code), []).append(source)
    read = [(members, code) for text, members in texts.items()
            for code in [_Code.of(text, handed)] if code.covered >= MIN_OWN_CODE]
    pairs = []
    for members, code in read:   # the same code: all of it shared
        pairs += _member_pairs(members, members, 1.0, code.covered,
                               functools.partial(_code_passages, code, code, code.own, code.own))
    for (members_a, a), (members_b, b) in combinations(read, 2):
        if all(s.earlier for s in members_a + members_b):
            continue
        common = np.intersect1d(a.kinds, b.kinds, assume_unique=True)
        if len(common) < CODE_FLOOR * min(len(a.kinds), len(b.kinds)) / 2:
            continue   # a bound first, cheaper than the measure: most pairs share little
        shared_a, shared_b = a.own & np.isin(a.grams, common), b.own & np.isin(b.grams, common)
        covered_a, covered_b = int(_cover(shared_a).sum()), int(_cover(shared_b).sum())
        score = round(max(covered_a / a.covered, covered_b / b.covered), 3)
        pairs += _member_pairs(members_a, members_b, score, max(covered_a, covered_b),
                               functools.partial(_code_passages, a, b, shared_a, shared_b))
    return pairs


def _member_pairs(members_a: list[Source], members_b: list[Source], score: float, shared: int,
                  passages: Callable[[], list[Passage]]) -> list[Pair]:
    """The code pairs two readings make (one reading with itself when both are one list), at or
    above the floor, earlier sources never paired together; ``passages`` is called once, when flagged."""
    together = [(a, b) for a, b in (combinations(members_a, 2) if members_a is members_b
                                    else product(members_a, members_b)) if not (a.earlier and b.earlier)]
    if score < CODE_FLOOR or not together:
        return []
    flagged = score > CODE_THRESHOLD and shared >= MIN_SHARED_CODE
    matched = passages() if flagged else []
    return [Pair(a.id, b.id, "code", score, flagged, how="code", shared=shared, passages=matched) for a, b in together]


# ---- written answers -----------------------------------------------------------------------


def answer_words(text: str) -> tuple[str, ...]:
    """``text`` as the queue's grouping reads it: hidden text undone, case folded, its tokens."""
    return answer_tokens(readable(text)[0])


def _anchor(token: str) -> bool:
    """Whether a token writes the same in every language: a number, a letter or symbol alone, a formula word."""
    return len(token) == 1 or token in _FORMULA_WORDS or (not token.isalpha() and any(c.isdigit() for c in token))


def _grams(tokens: Sequence[str], k: int) -> frozenset[tuple[str, ...]]:
    return frozenset(tuple(tokens[i:i + k]) for i in range(len(tokens) - k + 1))


Read = tuple[frozenset, frozenset]   # an answer's word 3-grams and anchor 3-grams


def _read(text: str, asked: Read = (frozenset(), frozenset())) -> Read:
    """``text``'s word and anchor 3-grams, less those of ``asked`` (the question's own)."""
    tokens = answer_words(text)
    return _grams(tokens, WORDS_K) - asked[0], _grams([t for t in tokens if _anchor(t)], ANCHORS_K) - asked[1]


def _containments(sets: Sequence[frozenset], least: int) -> np.ndarray:
    """For every two of ``sets``: the share of the smaller one that the other holds, all at once
    (the shared counts as one matrix product over the members that sit in two sets or more); NaN
    where a set has fewer than ``least`` members."""
    seen = Counter(chain.from_iterable(sets))
    columns = {member: n for n, member in enumerate(m for m, count in seen.items() if count > 1)}
    held = np.zeros((len(sets), len(columns)), np.float32)
    for row, found in enumerate(sets):
        held[row, [columns[m] for m in found if m in columns]] = 1
    sizes = np.array([len(found) for found in sets], np.float32)
    smaller = np.minimum.outer(sizes, sizes)
    shares = np.divide(held @ held.T, smaller, out=np.zeros_like(smaller), where=smaller > 0)
    shares[smaller < least] = np.nan
    np.fill_diagonal(shares, np.where(sizes >= least, 1.0, np.nan))
    return shares


def _scores(readings: Sequence[Read]) -> tuple[np.ndarray, np.ndarray]:
    """(by words: 0 where a side is too short to tell; by anchors: NaN where a side has too few),
    for every two of ``readings``."""
    words = np.nan_to_num(_containments([r[0] for r in readings], MIN_SHINGLES))
    return words, _containments([r[1] for r in readings], MIN_ANCHOR_SHINGLES)


def written_scores(a: str, b: str, question: str = "") -> tuple[float, float | None]:
    """Two answers to ``question`` compared: (by words, by anchors or None), as ``written_pairs`` scores them."""
    asked = _read(question)
    words, anchors = _scores([_read(a, asked), _read(b, asked)])
    return float(words[0, 1]), None if np.isnan(anchors[0, 1]) else float(anchors[0, 1])


def written_pairs(sources: Sequence[Source], questions: dict[str, str] | None = None) -> list[Pair]:
    """Every pair of answers to one question that scores at or above ``WRITTEN_FLOOR``, by words
    or by anchors, flagged above ``WRITTEN_THRESHOLD`` (words) or ``ANCHOR_THRESHOLD`` (anchors).
    ``questions`` (id -> the question's text): only these are compared, when given."""
    asked_ids = sorted(questions) if questions else sorted({q for s in sources for q in s.answers})
    pairs = []
    for qid in asked_ids:
        asked = _read((questions or {}).get(qid, ""))
        readings: dict[Read, list[Source]] = {}   # one reading per distinct answer, as for code
        for source in sources:
            if qid in source.answers:
                readings.setdefault(_read(source.answers[qid], asked), []).append(source)
        if not readings:
            continue
        read = list(readings)
        words, anchors = _scores(read)
        best = np.fmax(words, anchors)
        for i, j in zip(*np.nonzero(np.triu(best >= WRITTEN_FLOOR))):
            by_words, by_anchors = float(words[i, j]), 0.0 if np.isnan(anchors[i, j]) else float(anchors[i, j])
            flagged = by_words > WRITTEN_THRESHOLD or by_anchors > ANCHOR_THRESHOLD
            how = "words" if by_words >= by_anchors else "anchors"
            a, b = read[i], read[j]
            shared = len(a[0] & b[0]) if how == "words" else len(a[1] & b[1])
            together = combinations(readings[a], 2) if i == j else product(readings[a], readings[b])
            pairs += [Pair(sa.id, sb.id, "written", round(max(by_words, by_anchors), 3), flagged, qid, how, shared,
                           [Passage(cut(sa.answers[qid], MAX_PASSAGE_CHARS, WRITTEN_INPUTS),
                                    cut(sb.answers[qid], MAX_PASSAGE_CHARS, WRITTEN_INPUTS))] if flagged else [])
                      for sa, sb in together if not (sa.earlier and sb.earlier)]
    return pairs


# ---- the class -----------------------------------------------------------------------------


def read_source(folder: Path, source_id: str, earlier: bool = False) -> Source:
    """What a graded submission folder keeps for comparison (capped reads; a missing or damaged
    file is no code, or no answers)."""
    code = read_bytes(folder / SCAFFOLD_SOURCE, folder, MAX_SOURCE_BYTES)
    data = read_bytes(folder / WRITTEN_INPUTS, folder, MAX_SOURCE_BYTES)
    try:
        answers = json.loads(data).get("answers") if data is not None else {}
    except (ValueError, AttributeError, RecursionError):
        answers = {}
    answers = {str(q): str(t) for q, t in answers.items()} if isinstance(answers, dict) else {}
    return Source(source_id, code.decode("utf-8", "replace") if code is not None else "", answers, earlier)


def class_sources(out_dir: Path, results: Sequence[GradeResult], compare_with: Sequence[Path] = ()) -> list[Source]:
    """The class's submissions (their folders in ``out_dir``) by id, whatever order the results
    arrived in, then each earlier graded folder's submissions, named ``<folder>/<id>``."""
    found = [read_source(out_dir / sid, sid) for sid in sorted(r.submission_id for r in results)
             if SAFE_ID.fullmatch(sid)]
    for earlier in compare_with:
        for folder in sorted(p for p in Path(earlier).iterdir() if p.is_dir() and SAFE_ID.fullmatch(p.name)):
            found.append(read_source(folder, f"{earlier}/{folder.name}", earlier=True))
    return found


def compare(sources: Sequence[Source], boilerplate: Boilerplate = Boilerplate()) -> list[Pair]:
    """Every reported pair, code and written, flagged ones first, the highest score first; only the
    first ``MAX_PASSAGE_PAIRS`` keep their passages."""
    if len(sources) < 2:
        return []   # a class of one and no earlier folder: nothing to pair, so nothing is read
    pairs = sorted(code_pairs(sources, boilerplate.code) + written_pairs(sources, boilerplate.questions),
                   key=lambda p: (not p.flagged, -p.score, p.kind, p.question, p.a, p.b))
    for pair in pairs[MAX_PASSAGE_PAIRS:]:
        pair.passages = []   # a ring of copies makes pairs by the square: similarity.json stays bounded
    return pairs


def method() -> dict[str, Any]:
    """How pairs were found, as similarity.json records it."""
    return {"code": f"copydetect {metadata.version('copydetect')}: every {CODE_K}-gram of its filtered text "
                    "(names as one placeholder) of canonical code (ast), template and provided code removed; "
                    "score: the share of the smaller side's code the other holds",
            "written": f"word {WORDS_K}-grams (the question's own removed) and {ANCHORS_K}-grams of language-"
                       "independent tokens; score: the share of the smaller answer the other holds"}


def thresholds() -> dict[str, Any]:
    """The floors and thresholds in force, as similarity.json records them."""
    return {"code": {"floor": CODE_FLOOR, "flagged_above": CODE_THRESHOLD, "min_shared_chars": MIN_SHARED_CODE,
                     "min_own_chars": MIN_OWN_CODE},
            "written": {"floor": WRITTEN_FLOOR, "flagged_above": WRITTEN_THRESHOLD,
                        "anchors_flagged_above": ANCHOR_THRESHOLD, "min_shingles": MIN_SHINGLES,
                        "min_anchor_shingles": MIN_ANCHOR_SHINGLES}}


def inputs_digest(sources: Sequence[Source], boilerplate: Boilerplate, compare_with: Sequence[Path]) -> str:
    """A digest of what ``compare`` reads and of how it compares (its code and libraries,
    ``digests.similarity_digest``): ``compare`` is deterministic, so an equal digest means equal
    pairs."""
    read = {"sources": [asdict(s) for s in sources], "boilerplate": asdict(boilerplate),
            "earlier_folders": [str(p) for p in compare_with], "method": method(), "threshold": thresholds(),
            "passages_kept_for_first": MAX_PASSAGE_PAIRS, "code": digests.similarity_digest()}
    return hashlib.sha256(json.dumps(read, sort_keys=True).encode()).hexdigest()


def write_similarity(out_dir: Path, results: Sequence[GradeResult], assignment: Assignment,
                     compare_with: Sequence[Path] = ()) -> list[Pair]:
    """Compare the class (and ``compare_with``'s earlier folders) and write SIMILARITY_FILE in
    ``out_dir``; returns the pairs. When the file there was written from the same inputs
    (``inputs_digest``), its pairs are returned and nothing is compared or written."""
    sources = class_sources(out_dir, results, compare_with)
    boilerplate = Boilerplate.of(assignment)
    digest = inputs_digest(sources, boilerplate, compare_with)
    previous = read_similarity(out_dir)
    if previous is not None and previous.get("inputs") == digest:
        try:
            return [_pair(p) for p in previous["pairs"]]
        except (TypeError, KeyError):
            pass   # a file changed by hand: compared again below
    pairs = compare(sources, boilerplate)
    record = {"pairs": [asdict(p) for p in pairs], "threshold": thresholds(), "method": method(),
              "compared": {"class": sum(not s.earlier for s in sources), "earlier": sum(s.earlier for s in sources),
                           "earlier_folders": [str(p) for p in compare_with]},
              "passages_kept_for_first": MAX_PASSAGE_PAIRS, "inputs": digest}
    (out_dir / SIMILARITY_FILE).write_text(json.dumps(record, indent=1) + "\n")
    return pairs


def _pair(record: dict[str, Any]) -> Pair:
    """A pair as ``write_similarity`` recorded it."""
    return Pair(**{**record, "passages": [Passage(**passage) for passage in record["passages"]]})


def read_similarity(out_dir: Path) -> dict[str, Any] | None:
    """SIMILARITY_FILE as ``write_similarity`` wrote it, or None when the folder has none (or one
    this version cannot read: the next ``grader grade`` writes it again)."""
    data = read_bytes(out_dir / SIMILARITY_FILE, out_dir, MAX_RECORD_BYTES)
    try:
        record = json.loads(data) if data is not None else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("pairs"), list):
        return None
    return record


@dataclass(frozen=True)
class SimilarGroup:
    """Submissions linked by flagged pairs of one kind (and question): a ring of ten copies is
    one group for a TA, not forty-five pairs."""

    members: tuple[str, ...]   # sorted
    what: str                  # "code" or "written answer <question>"
    similarity: float          # the lowest score of the links that make the group


def flagged_groups(record: dict[str, Any]) -> list[SimilarGroup]:
    """The groups the flagged pairs of ``record`` make (single linkage, per kind and question),
    the closest first."""
    links: dict[str, list[dict[str, Any]]] = {}
    for pair in record.get("pairs", []):
        if isinstance(pair, dict) and pair.get("flagged"):
            what = "code" if pair.get("kind") == "code" else f"written answer {pair.get('question', '')}"
            links.setdefault(what, []).append(pair)
    groups = []
    for what, pairs in links.items():
        root: dict[str, str] = {}

        def find(member: str) -> str:
            while root.setdefault(member, member) != member:
                root[member] = root[root[member]]
                member = root[member]
            return member

        for pair in pairs:
            root[find(str(pair["a"]))] = find(str(pair["b"]))
        members: dict[str, list[str]] = {}
        for member in list(root):
            members.setdefault(find(member), []).append(member)
        for top, ids in members.items():
            lowest = min(float(p["score"]) for p in pairs if find(str(p["a"])) == top)
            groups.append(SimilarGroup(tuple(sorted(ids)), what, round(lowest, 3)))
    return sorted(groups, key=lambda g: (-g.similarity, g.members, g.what))


def run_similarity(out_dir: Path, results: Sequence[GradeResult], assignment: Assignment,
                   compare_with: Sequence[Path] = ()) -> str:
    """``write_similarity``, never raising: a line for the terminal, what it found or why it
    could not (with the traceback on stderr); the grades stand either way."""
    try:
        pairs = write_similarity(out_dir, results, assignment, compare_with)
    except Exception as exc:  # noqa: BLE001 - a batch never fails because of similarity
        traceback.print_exc(file=sys.stderr)
        return f"similarity: not compared ({type(exc).__name__}: {exc}); the grades stand"
    flagged = sum(p.flagged for p in pairs)
    return (f"similarity: {flagged} pair{'s' if flagged != 1 else ''} flagged, {len(pairs)} reported, "
            f"for a person to look at (nothing is penalized): {out_dir}/{SIMILARITY_FILE}, shown on the pages")
