"""The ``grader`` command line: assign, grade, report, validate, calibrate.

Exit status: 0 when the command did its job (whatever the scores), 1 when ``validate``
finds the solution or template graded wrongly, 2 when the grader itself could not run.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from grader import assign
from grader.assignment import Assignment
from grader.batch import default_workers, discover, grade_batch
from grader.pipeline import GRADER_ERRORS
from grader.report import OverrideError, apply_overrides, read_results, summary_table, write_gradebook
from grader.rubric import Limits, Rubric, RubricError
from grader.sandbox import Limits as SandboxLimits
from grader.sandbox import Sandbox, SandboxUnavailable, check_bubblewrap
from grader.validate import validate
from grader.written import grade_written
from grader.written.calibrate import calibrate, load_samples, report_table


class CommandError(Exception):
    """The grader cannot run (missing files, bad rubric, no sandbox): exit status 2."""


def _cmd_assign(args: argparse.Namespace) -> int:
    master = Path(args.master)
    if not master.is_file():
        raise CommandError(f"{master}: no such notebook")
    target = Path(args.out) if args.out else assign.student_path(master.resolve(), Path.cwd())
    assign.write_student_notebook(master, target)
    print(f"wrote {target}")
    return 0


def _assignment(args: argparse.Namespace) -> tuple[Assignment, Rubric]:
    assignment = Assignment(args.assignment)
    problem = assignment.check_files()
    if problem:
        raise CommandError(problem)
    try:
        rubric = assignment.rubric.with_limits(
            memory_gib=args.memory_gib, cpu_seconds=args.cpu_seconds, max_processes=args.max_processes,
            file_size_mib=args.file_size_mib, disk_mib=args.disk_mib, cell_output_kib=args.cell_output_kib,
            cell_timeout_s=args.cell_timeout, notebook_timeout_s=args.notebook_timeout)
    except RubricError as exc:
        raise CommandError(str(exc)) from exc
    return assignment, rubric


def make_sandbox(limits: Limits, allow_unsandboxed: bool) -> Sandbox:
    """The sandbox for one submission's commands, from the rubric's (possibly overridden) limits."""
    enforced = SandboxLimits(memory_bytes=int(limits.memory_gib * 2**30), cpu_seconds=limits.cpu_seconds,
                             max_processes=limits.max_processes,
                             file_size_bytes=limits.file_size_mib * 2**20,
                             disk_bytes=limits.disk_mib * 2**20,
                             wall_seconds=limits.notebook_timeout_s)
    try:
        sandbox = Sandbox(enforced, allow_unsandboxed=allow_unsandboxed)
    except SandboxUnavailable as exc:
        raise CommandError(f"the sandbox cannot run here: {exc}. Install bubblewrap (make install does, "
                           "as root) or pass --allow-unsandboxed to run student code WITHOUT isolation") from exc
    if not sandbox.sandboxed:
        print(f"WARNING: {check_bubblewrap()}; student code runs WITHOUT the sandbox", file=sys.stderr)
    return sandbox


def _cmd_grade(args: argparse.Namespace) -> int:
    assignment, rubric = _assignment(args)
    sandbox = make_sandbox(rubric.limits, args.allow_unsandboxed)
    try:
        submissions = discover([Path(p) for p in args.paths])
    except (FileNotFoundError, ValueError) as exc:
        raise CommandError(str(exc)) from exc
    out_dir = Path(args.out)
    print(f"grading {len(submissions)} submissions of {assignment.name} into {out_dir} "
          f"with {args.workers} workers", file=sys.stderr)
    outcome = grade_batch(submissions, assignment, sandbox, rubric, out_dir, args.workers)
    if args.llm != "off":
        overrides = {"model": args.llm_model, "max_tokens": args.llm_max_tokens, "concurrency": args.llm_concurrency,
                     "max_retries": args.llm_retries}
        llm = replace(rubric.llm, **{k: v for k, v in overrides.items() if v is not None})
        written = grade_written(out_dir, outcome.results, assignment, replace(rubric, llm=llm), args.llm,
                                args.llm_budget)
        print(written.note, file=sys.stderr)
    try:
        for line in apply_overrides(outcome.results, out_dir):
            print(f"override: {line}", file=sys.stderr)
    except OverrideError as exc:
        print(f"grader: {exc}", file=sys.stderr)
    write_gradebook(out_dir, outcome.results)
    print(summary_table(outcome.results))
    print(f"\nresults: {out_dir}/<id>/results.json; gradebook: {out_dir}/gradebook.csv")
    if outcome.internal_errors:
        print(f"{outcome.internal_errors} submissions hit an internal grader error (tracebacks in "
              f"{out_dir}/<id>/{GRADER_ERRORS}; rerunning regrades them)", file=sys.stderr)
        return 2
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    out_dir = Path(args.dir)
    results = read_results(out_dir)
    if not results:
        raise CommandError(f"{out_dir}: no results.json files to report on")
    try:
        log = apply_overrides(results, out_dir)
    except OverrideError as exc:
        raise CommandError(str(exc)) from exc
    for line in log:
        print(f"override: {line}")
    write_gradebook(out_dir, results)
    print(summary_table(results))
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    assignment, rubric = _assignment(args)
    path = Path(args.samples) if args.samples else assignment.root / "rubrics" / f"{assignment.name}_calibration.yaml"
    try:
        samples = load_samples(path, assignment)
        report = calibrate(assignment, rubric, samples, Path(args.out), args.llm)
    except RubricError as exc:
        raise CommandError(str(exc)) from exc
    print(report_table(report))
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    assignment, rubric = _assignment(args)
    sandbox = make_sandbox(rubric.limits, args.allow_unsandboxed)
    report = validate(assignment, sandbox, rubric)
    print(report.text)
    return 0 if report.ok else 1


def _add_grading_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--assignment", required=True, help="assignment name, e.g. linear_attention")
    parser.add_argument("--allow-unsandboxed", action="store_true",
                        help="run student code without bubblewrap when it is unusable (unsafe)")
    limits = parser.add_argument_group("limits (default: the rubric's)")
    limits.add_argument("--memory-gib", type=float)
    limits.add_argument("--cpu-seconds", type=int)
    limits.add_argument("--max-processes", type=int)
    limits.add_argument("--file-size-mib", type=int)
    limits.add_argument("--disk-mib", type=int)
    limits.add_argument("--cell-output-kib", type=int)
    limits.add_argument("--cell-timeout", type=float, help="seconds per cell")
    limits.add_argument("--notebook-timeout", type=float, help="seconds per notebook")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grader", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("assign", help="write the student notebook from a master notebook")
    p.add_argument("master", help="solutions/<name>/<name>.ipynb")
    p.add_argument("--out", help="target path (default assignments/<name>/<name>.ipynb)")
    p.set_defaults(run=_cmd_assign)

    p = commands.add_parser("grade", help="grade notebooks or folders of submissions")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--workers", type=int, default=default_workers(), help="parallel submissions")
    llm = p.add_argument_group("written answers (LLM grading; needs ANTHROPIC_API_KEY)")
    llm.add_argument("--llm", choices=("off", "live", "batch"), default="off",
                     help="off: pending_review; live: one request per answer; batch: one Message Batch "
                          "(half price, resumable)")
    llm.add_argument("--llm-budget", type=float, metavar="USD", help="stop sending once the estimate would pass this")
    llm.add_argument("--llm-model", help="default: the rubric's written.model")
    llm.add_argument("--llm-max-tokens", type=int, help="default: the rubric's written.max_tokens")
    llm.add_argument("--llm-concurrency", type=int, help="live requests in flight (default: the rubric's)")
    llm.add_argument("--llm-retries", type=int, help="retries per request (default: the rubric's)")
    _add_grading_options(p)
    p.set_defaults(run=_cmd_grade)

    p = commands.add_parser("report", help="re-render the gradebook after TA overrides")
    p.add_argument("dir", help="the output folder of a grade run")
    p.set_defaults(run=_cmd_report)

    p = commands.add_parser("calibrate", help="agreement of the LLM's drafts with TA-scored sample answers")
    p.add_argument("--samples", help="default: rubrics/<assignment>_calibration.yaml")
    p.add_argument("--out", default="out/calibration", help="where the samples' drafts (and cache) go")
    p.add_argument("--llm", choices=("live", "batch"), default="live")
    _add_grading_options(p)
    p.set_defaults(run=_cmd_calibrate)

    p = commands.add_parser("validate", help="the solution earns every point, the template the baseline")
    _add_grading_options(p)
    p.set_defaults(run=_cmd_validate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except CommandError as exc:
        print(f"grader: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
