"""Similarity across a class (issue 45): calibrated on tests/similarity/calibration, measured on
tests/similarity/heldout, and never in the way of grading.

The corpora: per assignment, ``independent.txt`` names solutions written independently (files of
tests/scaffolds/ or tests/hyena_corpus/, or ``reference``: the master's scaffold code), chosen
before any similarity was measured; ``<original>--<disguise>.py`` is a copy of one of them, disguised
by hand (renames, reordering, comments, dead code, equivalent expressions). ``written.yaml`` holds
answers written independently per question and disguised copies of some (reworded, reordered,
translated). A pair is a copy when both sides come from one original, else independent.
The thresholds are the calibration corpus's midpoints (``midpoint``); the held-out figures are
printed both ways (copies caught, independent pairs left alone) and asserted.
"""
from __future__ import annotations

import ast
import itertools
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from grader import cells
from grader import similarity as sim
from grader.assignment import Assignment
from grader.pipeline import SCAFFOLD_SOURCE
from grader.report.pages import SIMILARITY_PAGE, SUMMARY_PAGE, similarity_page_bound, write_similarity_page
from grader.written import WRITTEN_INPUTS

from bench.run import similarity_class
from conftest import ROOT

CORPORA = ROOT / "tests" / "similarity"
ORIGINALS = {"linear_attention": ROOT / "tests" / "scaffolds", "linear_attention_hyena": ROOT / "tests" / "hyena_corpus"}
ASSIGNMENTS = tuple(ORIGINALS)


def reference_code(assignment: Assignment) -> str:
    """The master's scaffold cells, solution markers and all (as a student who copied it would have them)."""
    return "\n\n\n".join(cells.source(c) for c in assignment.master.cells if cells.SCAFFOLD in cells.tags(c))


def code_corpus(part: str, name: str) -> dict[str, str]:
    """Document id -> code: the independent solutions, then the disguised copies."""
    folder = CORPORA / part / name
    docs = {}
    for original in (folder / "independent.txt").read_text().split():
        docs[original] = (reference_code(Assignment(name)) if original == "reference"
                          else (ORIGINALS[name] / f"{original}.py").read_text())
    docs.update({path.stem: path.read_text() for path in sorted(folder.glob("*--*.py"))})
    return docs


def original(doc: str) -> str:
    return doc.split("--")[0]


def written_corpus(part: str) -> dict[str, dict[str, dict[str, tuple[str, bool]]]]:
    """assignment -> question -> answer id -> (text, translated): ``<writer>`` or ``<writer>--<n>`` for a copy."""
    found: dict = {}
    for name, questions in yaml.safe_load((CORPORA / part / "written.yaml").read_text()).items():
        for qid, entry in questions.items():
            answers = {writer: (text, False) for writer, text in entry["independent"].items()}
            answers.update({f"{c['of']}--{n}": (c["text"], "translated" in c["disguise"])
                            for n, c in enumerate(entry["copies"])})
            found.setdefault(name, {})[qid] = answers
    return found


def code_scores(part: str) -> list[tuple[bool, float, int, str]]:
    """(copy?, score, shared characters, what) for every pair of both assignments' code corpora."""
    measured = []
    for name in ASSIGNMENTS:
        docs = code_corpus(part, name)
        sources = [sim.Source(doc, code, {}) for doc, code in docs.items()]
        scored = {(p.a, p.b): p for p in all_code_pairs(sources, Assignment(name))}
        for a, b in itertools.combinations(docs, 2):
            pair = scored.get((a, b))
            measured.append((original(a) == original(b), pair.score if pair else 0.0, pair.shared if pair else 0,
                             f"{name}: {a} / {b}"))
    return measured


def all_code_pairs(sources: list[sim.Source], assignment: Assignment) -> list[sim.Pair]:
    """Every pair's score, however low (the module lists only those at its floor)."""
    floor = sim.CODE_FLOOR
    sim.CODE_FLOOR = 0.0
    try:
        return sim.code_pairs(sources, sim.Boilerplate.of(assignment).code)
    finally:
        sim.CODE_FLOOR = floor


def written_scores(part: str) -> list[tuple[bool, bool, float, float, str]]:
    """(copy?, translated?, by words, by anchors, what) for every pair of answers to one question."""
    measured = []
    for name, questions in written_corpus(part).items():
        asked = sim.Boilerplate.of(Assignment(name)).questions
        for qid, answers in questions.items():
            for a, b in itertools.combinations(answers, 2):
                words, anchors = sim.written_scores(answers[a][0], answers[b][0], asked.get(qid, ""))
                measured.append((original(a) == original(b), answers[a][1] or answers[b][1], words, anchors,
                                 f"{name} {qid}: {a} / {b}"))
    return measured


def midpoint(independent: list[float], copies: list[float], step: float) -> float:
    """Halfway between the highest independent figure and the lowest copy's, to ``step``."""
    assert max(independent) < min(copies), "the calibration corpus does not separate"
    return round(round((max(independent) + min(copies)) / 2 / step) * step, 4)


def step_and_forward_alone(name: str, *parts: str) -> list[sim.Source]:
    """Each independent linear_attention solution's ``step``, and its ``forward``, as a submission
    of its own: short code where independent solutions converge on one idiom."""
    found = []
    for original_name in [n for part in parts for n in (CORPORA / part / name / "independent.txt").read_text().split()]:
        code = (reference_code(Assignment(name)) if original_name == "reference"
                else (ORIGINALS[name] / f"{original_name}.py").read_text())
        tree = cells.parse_python(code)
        methods = [n for c in tree.body if isinstance(c, ast.ClassDef) for n in c.body if isinstance(n, ast.FunctionDef)]
        for method in methods:
            if method.name in ("step", "forward"):
                body = "class LinearAttention(Module):\n" + "\n".join(f"    {line}" for line in ast.unparse(method).splitlines())
                found.append(sim.Source(f"{original_name}.{method.name}", body, {}))
    return found


def test_the_thresholds_are_the_calibration_corpus_midpoints() -> None:
    code = code_scores("calibration")
    written = written_scores("calibration")
    idioms = [p.shared for p in all_code_pairs(step_and_forward_alone("linear_attention", "calibration"),
                                               Assignment("linear_attention"))]
    code_threshold = midpoint([s for copy, s, _, _ in code if not copy], [s for copy, s, _, _ in code if copy], 0.05)
    shared = midpoint(idioms, [n for copy, _, n, _ in code if copy], 50)
    words = midpoint([w for copy, _, w, _, _ in written if not copy],
                     [w for copy, translated, w, _, _ in written if copy and not translated], 0.05)
    compared = [(copy, a) for copy, _, _, a, _ in written if a is not None]
    anchors = midpoint([a for copy, a in compared if not copy], [a for copy, a in compared if copy], 0.05)
    def extremes(measured: list[tuple[bool, float]]) -> str:
        return (f"highest independent {max(v for c, v in measured if not c):.2f}, "
                f"lowest copy {min(v for c, v in measured if c):.2f}")
    print(f"\ncalibration: code {sum(c for c, *_ in code)} copies, {sum(not c for c, *_ in code)} independent pairs "
          f"({extremes([(c, s) for c, s, _, _ in code])}): threshold {code_threshold}; shared >= {shared} (independent "
          f"short methods share at most {max(idioms)}, copies at least {min(n for c, _, n, _ in code if c)}); "
          f"written {sum(c for c, *_ in written)} copies, {sum(not c for c, *_ in written)} independent pairs: "
          f"words {words} ({extremes([(c, w) for c, t, w, _, _ in written if not t])}), "
          f"anchors {anchors} ({extremes(compared)}, {sum(c for c, _ in compared)} copies compared)")
    assert (sim.CODE_THRESHOLD, sim.MIN_SHARED_CODE, sim.WRITTEN_THRESHOLD, sim.ANCHOR_THRESHOLD) == (
        code_threshold, shared, words, anchors)


def figures(truth: list[bool], flagged: list[bool]) -> tuple[float, float, int, int]:
    """(precision, recall, copies, independent pairs)."""
    caught = sum(t and f for t, f in zip(truth, flagged))
    precision = caught / sum(flagged) if any(flagged) else 1.0
    return precision, caught / sum(truth), sum(truth), len(truth) - sum(truth)


def test_held_out_copies_are_caught_and_independent_pairs_left_alone() -> None:
    truth, flagged = [], []
    for name in ASSIGNMENTS:
        docs = code_corpus("heldout", name)
        sources = [sim.Source(doc, code, {}) for doc, code in docs.items()]
        found = {(p.a, p.b) for p in sim.code_pairs(sources, sim.Boilerplate.of(Assignment(name)).code) if p.flagged}
        for a, b in itertools.combinations(docs, 2):
            truth.append(original(a) == original(b))
            flagged.append((a, b) in found)
    code = figures(truth, flagged)
    truth, flagged, translated = [], [], []
    for name, questions in written_corpus("heldout").items():
        sources = {}
        for qid, answers in questions.items():
            for writer, (text, _) in answers.items():
                sources.setdefault(writer, {})[qid] = text
        pairs = sim.written_pairs([sim.Source(w, "", a) for w, a in sources.items()],
                                  sim.Boilerplate.of(Assignment(name)).questions)
        found = {(p.question, p.a, p.b) for p in pairs if p.flagged}
        for qid, answers in questions.items():
            for a, b in itertools.combinations(answers, 2):
                truth.append(original(a) == original(b))
                flagged.append((qid, a, b) in found)
                translated.append(truth[-1] and (answers[a][1] or answers[b][1]))
    written = figures(truth, flagged)
    translations = sum(t and f for t, f in zip(translated, flagged)), sum(translated)
    print(f"\nheld out: code: {code[2]} copies, {code[3]} independent pairs: precision {code[0]:.2f}, recall "
          f"{code[1]:.2f}; written: {written[2]} copies ({translations[1]} translated), {written[3]} independent "
          f"pairs: precision {written[0]:.2f}, recall {written[1]:.2f} (translations caught: {translations[0]} of "
          f"{translations[1]})")
    assert code[:2] == (1.0, 1.0)
    assert written[0] == 1.0 and written[1] >= 0.8 and translations[0] >= 1


def test_short_code_that_converges_on_one_idiom_is_not_flagged() -> None:
    """Independent ``step`` methods alone write the decayed recurrence alike (scores above the
    threshold): too little in common to flag."""
    pairs = all_code_pairs(step_and_forward_alone("linear_attention", "calibration", "heldout"),
                           Assignment("linear_attention"))
    alike = [p for p in pairs if p.score > sim.CODE_THRESHOLD]
    print("\nalike, not flagged: " + "; ".join(f"{p.a} / {p.b}: {p.score:.2f}, {p.shared} characters" for p in alike))
    assert alike and not any(p.flagged for p in pairs)


def test_the_template_and_earlier_terms_among_themselves_are_never_pairs() -> None:
    assignment = Assignment("linear_attention")
    template = "\n\n".join(cells.source(c) for c in assignment.template.cells if cells.SCAFFOLD in cells.tags(c))
    copied = (ROOT / "tests" / "scaffolds" / "correct_einsum.py").read_text()
    sources = [sim.Source("untouched_1", template, {}), sim.Source("untouched_2", template, {}),
               sim.Source("old/a", copied, {}, earlier=True), sim.Source("old/b", copied, {}, earlier=True),
               sim.Source("now", copied, {})]
    pairs = sim.compare(sources, sim.Boilerplate.of(assignment))
    assert {(p.a, p.b) for p in pairs} == {("old/a", "now"), ("old/b", "now")}
    assert all(p.flagged and p.kind == "code" and p.passages for p in pairs)


def test_a_class_of_one_reads_nothing_and_one_earlier_folder_makes_it_a_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    """One submission alone has nothing to be compared with (``grader grade`` of one notebook spent
    about 0.4 s reading it); with an earlier term's copy beside it, it is read and paired."""
    assignment = Assignment("linear_attention")
    copied = (ROOT / "tests" / "scaffolds" / "correct_einsum.py").read_text()
    real_copydetect, read = sim._copydetect, []
    monkeypatch.setattr(sim, "_copydetect", lambda: read.append(1) or real_copydetect())
    alone = [sim.Source("now", copied, {"explain-delta-rule": "the state forgets along its key"})]
    assert sim.compare(alone, sim.Boilerplate.of(assignment)) == [] and not read
    pairs = sim.compare(alone + [sim.Source("old/a", copied, {}, earlier=True)], sim.Boilerplate.of(assignment))
    assert [(p.a, p.b, p.flagged) for p in pairs] == [("now", "old/a", True)] and read


def test_an_answer_is_compared_without_the_questions_own_words() -> None:
    """Two answers that repeat the question and add different content are not a pair."""
    assignment = Assignment("linear_attention")
    question = assignment.reference_answers["explain_gate"].question
    a = f"{question} {question} A gate reads the token and can reset the memory at a document boundary."
    b = f"{question} {question} The constant decay sets one horizon per head of about 1/(1 - gamma) tokens."
    assert sim.written_scores(a, b, question)[0] < sim.WRITTEN_FLOOR
    assert sim.written_scores(a, b, "")[0] > sim.WRITTEN_THRESHOLD   # the question's words alone would pair them


def graded_folder(folder: Path, ids_and_code: dict[str, tuple[str, dict[str, str]]]) -> None:
    """What a graded folder keeps of each submission, as the similarity stage reads it."""
    for sid, (code, answers) in ids_and_code.items():
        (folder / sid).mkdir(parents=True)
        (folder / sid / SCAFFOLD_SOURCE).write_text(code)
        (folder / sid / WRITTEN_INPUTS).write_text(json.dumps({"answers": answers}))


class _Result:
    """The one field of a GradeResult the stage reads."""

    def __init__(self, submission_id: str) -> None:
        self.submission_id = submission_id


def test_the_json_and_the_page_show_pairs_escaped_and_bounded(tmp_path: Path) -> None:
    assignment = Assignment("linear_attention")
    hostile = "<script>alert(1)</script>&"
    base = (ROOT / "tests" / "scaffolds" / "correct_einsum.py").read_text()
    answer = "A fixed decay forgets at one rate per head; a gate reads each token and decides. " * 3
    huge = f"x = '{hostile}'\n" + base + f"\n# {hostile * 20_000}\n"
    graded_folder(tmp_path / "now", {"alice": (base, {"explain_gate": answer}),
                                     "bob": (huge, {"explain_gate": answer + hostile * 5000})})
    graded_folder(tmp_path / "2025", {"carol": (base, {}), "dave": (base, {})})
    results = [_Result("alice"), _Result("bob")]
    pairs = sim.write_similarity(tmp_path / "now", results, assignment, [tmp_path / "2025"])
    write_similarity_page(tmp_path / "now", assignment.name)
    record = json.loads((tmp_path / "now" / sim.SIMILARITY_FILE).read_text())
    assert {(p["a"], p["b"], p["kind"]) for p in record["pairs"] if p["flagged"]} >= {
        ("alice", "bob", "code"), ("alice", "bob", "written"), ("alice", f"{tmp_path / '2025'}/carol", "code")}
    assert not any("2025" in p["a"] and "2025" in p["b"] for p in record["pairs"])
    assert set(record) >= {"pairs", "threshold", "method"} and all(0 <= p["score"] <= 1 for p in record["pairs"])
    page = (tmp_path / "now" / SIMILARITY_PAGE).read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page and f'href="{SUMMARY_PAGE}"' in page
    assert 'href="alice/review.html"' in page
    assert len(page.encode()) < similarity_page_bound()
    assert len(pairs) == len(record["pairs"])


def test_unchanged_inputs_keep_the_file_and_a_changed_one_is_compared_again(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A second run on the same graded folder (a regrade that changed nothing) compares nothing
    and leaves similarity.json as it was; a changed answer, an earlier folder added or a change to
    the comparison's code is compared again."""
    assignment = Assignment("linear_attention")
    base = (ROOT / "tests" / "scaffolds" / "correct_einsum.py").read_text()
    answer = "A fixed decay forgets at one rate per head; a gate reads each token and decides. " * 3
    graded_folder(tmp_path / "now", {"alice": (base, {"explain_gate": answer}), "bob": (base, {"explain_gate": answer})})
    graded_folder(tmp_path / "2025", {"carol": (base, {})})
    results = [_Result("alice"), _Result("bob")]
    first = sim.write_similarity(tmp_path / "now", results, assignment)
    written = (tmp_path / "now" / sim.SIMILARITY_FILE).read_bytes()
    compared = []
    real_compare = sim.compare
    monkeypatch.setattr(sim, "compare", lambda *args: compared.append(args) or real_compare(*args))
    again = sim.write_similarity(tmp_path / "now", results[::-1], assignment)   # results in another order
    assert again == first and {(p.a, p.b, p.kind) for p in again} >= {("alice", "bob", "code"), ("alice", "bob", "written")}
    assert compared == [] and (tmp_path / "now" / sim.SIMILARITY_FILE).read_bytes() == written
    (tmp_path / "now" / "bob" / WRITTEN_INPUTS).write_text(json.dumps({"answers": {"explain_gate": "Something else."}}))
    changed = sim.write_similarity(tmp_path / "now", results, assignment)
    assert len(compared) == 1 and ("alice", "bob", "written") not in {(p.a, p.b, p.kind) for p in changed}
    with_earlier = sim.write_similarity(tmp_path / "now", results, assignment, [tmp_path / "2025"])
    assert len(compared) == 2 and any("2025" in p.b for p in with_earlier)
    # a change to the code it compares with (grader.digests.SIMILARITY_FILES) compares again too
    monkeypatch.setattr(sim.digests, "similarity_digest", lambda: "another comparison")
    sim.write_similarity(tmp_path / "now", results, assignment, [tmp_path / "2025"])
    assert len(compared) == 3


def test_a_failure_is_reported_and_never_raised(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graded_folder(tmp_path, {"alice": ("x = 1", {})})
    note = sim.run_similarity(tmp_path, [_Result("alice")], Assignment("linear_attention"), [tmp_path / "missing"])
    assert note.startswith("similarity: not compared (FileNotFoundError") and "the grades stand" in note
    assert "Traceback" in capsys.readouterr().err


def test_a_class_of_200_takes_a_few_seconds() -> None:
    sources = similarity_class(200)
    boilerplate = sim.Boilerplate.of(Assignment("linear_attention"))
    started, cpu = time.perf_counter(), time.process_time()
    pairs = sim.compare(sources, boilerplate)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(f"\n200 submissions: {seconds:.1f} s ({cpu:.1f} s of CPU), {len(pairs)} pairs reported, "
          f"{sum(p.flagged for p in pairs)} flagged")
    assert cpu < 10 and any(p.flagged for p in pairs)   # CPU time: the machine's load does not move it


def test_grade_writes_the_page_linked_from_the_summary_and_changes_no_score(tmp_path: Path) -> None:
    """One real batch: the hyena reference and a copy of it under another name."""
    submissions = tmp_path / "in"
    submissions.mkdir()
    reference = ROOT / "examples" / "submissions" / "linear_attention_hyena" / "reference.ipynb"
    shutil.copy(reference, submissions / "alice.ipynb")
    shutil.copy(reference, submissions / "bob.ipynb")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "grader.cli", "grade", str(submissions), "--assignment",
                           "linear_attention_hyena", "--out", str(out), "--workers", "1"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr
    assert re.search(r"similarity: \d+ pairs? flagged, \d+ reported", done.stderr), done.stderr
    record = json.loads((out / sim.SIMILARITY_FILE).read_text())
    assert any(p["a"] == "alice" and p["b"] == "bob" and p["kind"] == "code" and p["flagged"] for p in record["pairs"])
    summary = (out / SUMMARY_PAGE).read_text()
    assert f'href="{SIMILARITY_PAGE}"' in summary and re.search(r'id="similar">.*alice</a>, <a[^>]*>bob</a>', summary,
                                                                 re.S)
    scores = {sid: json.loads((out / sid / "results.json").read_text())["score"] for sid in ("alice", "bob")}
    again = subprocess.run([sys.executable, "-m", "grader.cli", "grade", str(submissions), "--assignment",
                            "linear_attention_hyena", "--out", str(out), "--similarity", "off"],
                           capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert again.returncode == 0 and "similarity:" not in again.stderr
    assert not (out / sim.SIMILARITY_FILE).exists() and "Not compared in this folder" in (out / SUMMARY_PAGE).read_text()
    assert scores == {sid: json.loads((out / sid / "results.json").read_text())["score"] for sid in ("alice", "bob")}
