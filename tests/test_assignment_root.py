"""An assignment kept outside the project (`grader grade --assignment-root DIR`): its checks
module is found in DIR/checks/, judges, is digested from its own files and is hidden from
student code. In process: the bench's small assignment (bench/) with its reference and a
one-bug mutant, probed by the harness's own code (tests/probe_in_process.py)."""
from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest

from grader import cells, digests
from grader.assignment import PROJECT_ROOT, Assignment
from grader.checks import CheckContext, checks_for
from grader.cli import _assignment, build_parser
from grader.sandbox.factory import hidden_paths
from grader.graft import submission_module_source

from probe_in_process import probe_in_process

BENCH_ROOT = PROJECT_ROOT / "bench"
NAME = "small_questions"
CHECKS_FILE = Path("checks") / "small_questions_checks.py"


def _copy_root(target: Path) -> Path:
    for part in ("solutions", "assignments", "rubrics", "checks"):
        shutil.copytree(BENCH_ROOT / part, target / part, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def _digests(root: Path) -> tuple[str, str]:
    assignment = Assignment(NAME, root)
    checks = checks_for(assignment.rubric, root)
    return (digests.execution_digest(checks, assignment.rubric, assignment.fingerprint),
            digests.evaluation_digest(checks, assignment.rubric))


def _verdicts(root: Path, scaffold_edit: tuple[str, str] | None = None) -> dict[str, str]:
    """Each scaffold item's status for the master's own code (or with one edit in it)."""
    assignment = Assignment(NAME, root)
    checks = checks_for(assignment.rubric, root)
    sources = {c.id: cells.source(c) for c in assignment.master.cells if cells.SCAFFOLD in cells.tags(c)}
    if scaffold_edit:
        old, new = scaffold_edit
        sources = {cid: src.replace(old, new) for cid, src in sources.items()}
    source, _ = submission_module_source(assignment.master, sources)
    probe = probe_in_process(source, checks.probe_cases(assignment.rubric))
    context = CheckContext(assignment.rubric, assignment.master_path, probe, None, None, "not executed here")
    return {name: v.status for name, v in checks.evaluate(context).items() if name != "notebook_runs"}


def test_the_cli_loads_an_assignment_and_its_checks_from_another_root():
    args = build_parser().parse_args(["grade", "x.ipynb", "--out", "o", "--assignment", NAME,
                                      "--assignment-root", str(BENCH_ROOT)])
    assignment, rubric = _assignment(args)
    assert assignment.root == BENCH_ROOT and assignment.check_files() is None
    checks = checks_for(rubric, assignment.root)
    assert Path(checks.__file__) == BENCH_ROOT / CHECKS_FILE
    # what student code must not read includes the root's checks, beside the master and the rubric
    assert BENCH_ROOT / "checks" in hidden_paths(assignment)
    # the project's own assignments still come from the grader package
    default = Assignment("linear_attention_hyena")
    assert checks_for(default.rubric, default.root).__name__ == "grader.checks.linear_attention_hyena"


def test_the_root_checks_judge_the_reference_and_a_mutant():
    assert set(_verdicts(BENCH_ROOT).values()) == {"passed"}
    # softplus written naively overflows to inf at x = 1000: that item alone fails
    naive = ("    return torch.logaddexp(torch.zeros_like(x), x)", "    return torch.log(1 + torch.exp(x))")
    assert _verdicts(BENCH_ROOT, naive) == {"softplus": "failed", "running_mean": "passed",
                                           "pairwise_sq_dists": "passed"}


def test_a_root_checks_module_is_digested_from_its_own_files(tmp_path):
    before = _digests(_copy_root(tmp_path / "before"))
    message = _copy_root(tmp_path / "message")
    checks = message / CHECKS_FILE
    text = checks.read_text()
    assert "matches the reference on" in text
    checks.write_text(text.replace("matches the reference on", "agrees with the reference on"))
    after_message = _digests(message)
    assert after_message[0] == before[0], "a check's message is evaluation only: nothing runs again"
    assert after_message[1] != before[1], "a check's message must change the evaluation digest"

    inputs = _copy_root(tmp_path / "inputs")
    checks = inputs / CHECKS_FILE
    checks.write_text(checks.read_text().replace("np.linspace(-50.0, 50.0, 101)", "np.linspace(-40.0, 40.0, 81)"))
    assert _digests(inputs)[0] != before[0], "new probe inputs change what runs: the execution digest"


def test_a_missing_root_checks_module_is_an_import_error(tmp_path):
    root = _copy_root(tmp_path / "root")
    (root / CHECKS_FILE).unlink()
    with pytest.raises(ModuleNotFoundError):
        checks_for(Assignment(NAME, root).rubric, root)


def test_the_committed_small_student_files_match_a_fresh_assign(tmp_path):
    from grader.assign import write_student_files

    committed = BENCH_ROOT / "assignments" / NAME
    notebook, script = write_student_files(BENCH_ROOT / "solutions" / NAME / f"{NAME}.ipynb",
                                           tmp_path / f"{NAME}.ipynb")
    assert notebook.read_bytes() == (committed / notebook.name).read_bytes(), "run grader assign on bench's master"
    assert script.read_bytes() == (committed / script.name).read_bytes(), "run grader assign on bench's master"


def test_an_assignment_reaches_a_pool_worker_as_its_name_and_root(tmp_path):
    """A pool worker gets the assignment in the message that starts it. What was read of its
    files stays behind: a message over the pipe's 64 KiB would hold the coordinator until the
    worker, still importing, read it. The worker reads the same files again."""
    assignment = Assignment(NAME, _copy_root(tmp_path))
    read = (assignment.master, assignment.template, assignment.rubric, assignment.fingerprint)
    sent = pickle.dumps(assignment)
    assert len(sent) < 1024
    received = pickle.loads(sent)
    assert (received.name, received.root) == (NAME, tmp_path)
    assert not {"master", "template", "rubric", "reference_answers"} & set(vars(received))
    assert (received.master, received.template, received.rubric, received.fingerprint) == read


def test_a_new_assignments_review_page_shows_its_question_and_criteria_under_its_root(tmp_path):
    """`grader new --out ROOT` lays an assignment out under ROOT; graded with --assignment-root
    ROOT, its review page (and `grader report DIR` later, without the option) shows each written
    answer's question and criteria, as the repository's own assignments' pages do. In process:
    a recorded result with the question pending."""
    from contextlib import redirect_stdout
    from io import StringIO

    from grader.assign import new_assignment
    from grader.cli import main
    from grader.report.pages import REVIEW_PAGE, write_pages
    from grader.report.results import read_results, write_result
    from grader.score import GradeResult, ItemResult

    root = tmp_path / "course"
    new_assignment("fresh_course", root)
    assignment = Assignment("fresh_course", root)
    (question,) = assignment.rubric.questions
    items = [ItemResult(i.name, i.title, i.points, i.points, "passed", "ok", list(i.tags), i.visibility)
             for i in assignment.rubric.items]
    items.append(ItemResult(question.item_name, question.title, 0.0, question.points, "pending_review",
                            "awaiting review", ["written"], "after_published"))
    out = tmp_path / "out"
    write_result(out, GradeResult("ada", "fresh_course", "0", "0" * 64, items))
    asked = assignment.reference_answers[question.id].question

    def shown() -> str:
        review = (out / "ada" / REVIEW_PAGE).read_text()
        assert f'<blockquote class="question">{asked}</blockquote>' in review
        for criterion in question.criteria:
            assert f"<td>{criterion.id}</td><td>{criterion.earns}</td>" in review
        return review

    write_pages(out, read_results(out), root=root)   # what `grader grade --assignment-root` does
    shown()
    (out / "ada" / REVIEW_PAGE).unlink()
    with redirect_stdout(StringIO()):
        assert main(["report", str(out)]) == 0    # the folder remembers the root
    shown()


def test_grader_new_takes_the_root_as_the_other_commands_spell_it():
    for option in ("--out", "--assignment-root"):
        assert build_parser().parse_args(["new", "fresh", option, "some/root"]).out == "some/root"
