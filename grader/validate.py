"""``grader validate``: the reference solution earns every autograded point and the untouched
student notebook earns exactly the rubric's ``baseline`` items. CI runs it on every change.
It also says how many of the master's test cells are decided in the sandbox (aim for none)."""
from __future__ import annotations

from dataclasses import dataclass

from grader.assignment import Assignment
from grader.pipeline import SubmissionGrader
from grader.rubric import WRITTEN_TAG, Rubric
from grader.sandbox import Sandbox
from grader.score import GradeResult


@dataclass
class ValidationReport:
    ok: bool
    text: str
    solution: GradeResult
    template: GradeResult


def validate(assignment: Assignment, sandbox: Sandbox, rubric: Rubric) -> ValidationReport:
    grader = SubmissionGrader(assignment, sandbox, rubric)
    solution = grader.grade(assignment.master_path, "solution")
    template = grader.grade(assignment.template_path, "template")
    baseline = {i.name for i in rubric.items if i.baseline}
    problems = []
    for item in solution.items:
        if WRITTEN_TAG in item.tags:
            if item.status != "pending_review":
                problems.append(f"solution: written {item.name} is {item.status}: {item.output}")
        elif item.status != "passed":
            problems.append(f"solution: {item.name} {item.status}: {item.output}")
    for item in template.items:
        if WRITTEN_TAG in item.tags:
            if item.status != "failed":
                problems.append(f"template: written {item.name} should be blank, is {item.status}")
        elif (item.status == "passed") != (item.name in baseline):
            expected = "pass (baseline)" if item.name in baseline else "not pass"
            problems.append(f"template: {item.name} should {expected}, is {item.status}: {item.output}")
    autograded = sum(i.max_score for i in solution.items if WRITTEN_TAG not in i.tags)
    lines = [f"solution: {solution.score:g} / {autograded:g} autograded points "
             f"({len(rubric.questions)} written answers pending review)",
             f"template: {template.score:g} points from baseline items {sorted(baseline)}"]
    tests = grader.inline_tests
    if tests:
        inside = [t for t in tests if t.in_sandbox]
        lines.append(f"test cells: {len(tests)}, {len(inside)} of them ({100 * len(inside) / len(tests):.0f}%) "
                     "decided in the sandbox" + (": their form cannot be compared outside the student's process, "
                                                 "so a TA confirms each pass" if inside else ""))
        lines += [f"  {test.name}: {reason}" for test in inside for reason in test.sandbox_reasons]
    lines += [f"PROBLEM {p}" for p in problems] or ["validate: OK"]
    return ValidationReport(not problems, "\n".join(lines), solution, template)
