"""The ``grader`` command line: new, import, assign, grade, report, export, publish, validate,
calibrate, check, gradescope-bundle.

Exit status: 0 when the command did its job (whatever the scores), 1 when ``validate``
finds the solution or template graded wrongly, ``check`` finds the notebook not ready or
``publish`` could not post some student, 2 when the grader itself could not run, 128 + N when
signal N (SIGINT, SIGTERM) stopped ``grade`` or ``publish``.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from grader import assign, requirements
from grader.assignment import PROJECT_ROOT, Assignment
from grader.batch import BatchInterrupted, default_workers, grade_batch
from grader.checks import CHECKS_FOLDER, checks_for, inline
from grader.executors import BatchError, dask_executor
from grader.intake import Refused, discover, read_file, safe_id
from grader.load import package_files
from grader.pipeline import GRADER_ERRORS
from grader.report.changes import record_changes
from grader.report.export import ExportError, export_canvas
from grader.report.overrides import OverrideError, apply_overrides
from grader.report.pages import RELEASES, SIMILARITY_PAGE, SUMMARY_PAGE, release_state, write_pages
from grader.report.plots import load_matplotlib
from grader.report.results import is_pending, read_results, write_gradebook
from grader.report.terminal import counted, print_scores, say
from grader.rubric import Limits, Rubric, RubricError
from grader.sandbox import ISOLATION_LEVELS
from grader.sandbox.factory import NoSandbox, hidden_paths, make_sandbox
from grader.score import GradeResult
from grader.similarity import SIMILARITY_FILE, run_similarity
from grader.validate import validate
from grader.written import grade_written
from grader.written.calibrate import calibrate, load_samples, report_table


class CommandError(Exception):
    """The grader cannot run (missing files, bad rubric, no sandbox): exit status 2."""


def _cmd_assign(args: argparse.Namespace) -> int:
    master = Path(args.master)
    if not master.is_file():
        raise CommandError(f"{master}: no such notebook")
    root = Path(args.assignment_root) if args.assignment_root else master.resolve().parents[2]
    target = Path(args.out) if args.out else assign.student_path(master.resolve(), root)
    try:
        written = assign.write_student_files(master, target)
    except (ValueError, RubricError) as exc:
        raise CommandError(str(exc)) from exc
    for path in written:
        say(f"wrote {path}")
    return 0


def _cmd_new(args: argparse.Namespace) -> int:
    root = Path(args.out)
    try:
        written = assign.new_assignment(args.name, root)
    except (ValueError, RubricError) as exc:
        raise CommandError(str(exc)) from exc
    for path in written:
        say(f"wrote {path}")
    say(f"next: grader validate --assignment {args.name} --assignment-root {root}")
    return 0


def _cmd_import(args: argparse.Namespace) -> int:
    """A peer's master notebook (otter-assign's or nbgrader's source) as an assignment under --out."""
    from grader.importers import ImportRefused, write_assignment   # only this command needs them
    from grader.importers import nbgrader as nbgrader_format, otter as otter_format

    source = Path(args.notebook)
    if not source.is_file():
        raise CommandError(f"{source}: no such notebook")
    reader = {"otter": otter_format.read, "nbgrader": nbgrader_format.read}[args.format]
    try:
        draft = reader(source, args.name)
        try:
            written = write_assignment(draft, Path(args.out))
        finally:   # what was not imported is said whether or not the rest could be written
            for note in draft.notes:
                say(f"import: {note}", sys.stderr)
    except (ImportRefused, ValueError, RubricError) as exc:   # ValueError: nbformat's unreadable notebook
        raise CommandError(f"{source}: {exc}") from exc
    for path in written:
        say(f"wrote {path}")
    say(f"next: grader validate --assignment {draft.name} --assignment-root {args.out}")
    return 0


def _root(args: argparse.Namespace) -> Path:
    """The assignment root a command reads (``--assignment-root``, default this project)."""
    return Path(args.assignment_root).resolve() if args.assignment_root else PROJECT_ROOT


def _assignment(args: argparse.Namespace) -> tuple[Assignment, Rubric]:
    assignment = Assignment(args.assignment, _root(args))
    problem = assignment.check_files()
    if problem:
        raise CommandError(problem)
    try:
        rubric = assignment.rubric.with_limits(
            memory_gib=args.memory_gib, cpu_seconds=args.cpu_seconds, max_processes=args.max_processes,
            file_size_mib=args.file_size_mib, disk_mib=args.disk_mib, cell_output_kib=args.cell_output_kib,
            cell_timeout_s=args.cell_timeout, notebook_timeout_s=args.notebook_timeout,
            idle_timeout_s=args.idle_timeout)
    except RubricError as exc:
        raise CommandError(str(exc)) from exc
    try:
        checks_for(rubric, assignment.root)
    except ImportError as exc:
        raise CommandError(f"the rubric's checks module `{rubric.checks}` cannot be imported ({exc}): write "
                           f"{assignment.root / CHECKS_FOLDER / rubric.checks}.py (or a package of that name), or "
                           "drop `checks:` from the rubric to grade with the master's test cells alone") from exc
    try:
        inline.inline_tests(assignment.master)
    except inline.InlineError as exc:
        raise CommandError(f"{assignment.master_path}: {exc}") from exc
    return assignment, rubric


def _installed_requirements(assignment: Assignment, rubric: Rubric) -> list[Path]:
    """The folder the assignment's own requirements are importable from, installed once per
    content ([] when it has none); a package that cannot be installed stops the command."""
    try:
        site = requirements.install(requirements.declared(rubric.settings), assignment.root / requirements.ENVS)
    except requirements.RequirementsError as exc:
        raise CommandError(f"{assignment.rubric_path}: {exc}") from exc
    return [site] if site else []


def _cmd_grade(args: argparse.Namespace) -> int:
    assignment, rubric = _assignment(args)
    sandbox = make_sandbox(rubric.limits, args.allow_unsandboxed, args.isolation,
                           [*hidden_paths(assignment), Path(args.out), *map(Path, args.paths)],
                           _installed_requirements(assignment, rubric))
    try:
        submissions = discover([Path(p) for p in args.paths], package_files(assignment.template))
    except (FileNotFoundError, ValueError) as exc:
        raise CommandError(str(exc)) from exc
    if args.scheduler and args.executor != "dask":
        raise CommandError("--scheduler is for --executor dask")
    try:
        executor = dask_executor(args.scheduler) if args.executor == "dask" else None
    except BatchError as exc:
        raise CommandError(str(exc)) from exc
    out_dir = Path(args.out)
    missing = [p for p in args.compare_with if not Path(p).is_dir()]
    if missing:
        raise CommandError(f"--compare-with: {', '.join(missing)}: no such graded folder")
    release = _release(out_dir, args.release)
    before = {r.submission_id: r for r in read_results(out_dir)}
    on = (f"on the Dask scheduler at {args.scheduler}" if args.scheduler else
          f"with {args.workers} {'Dask worker processes' if executor else 'workers'}")
    say(f"grading {counted(len(submissions), 'submission')} of {assignment.name} into {out_dir} {on}", sys.stderr)
    try:
        outcome = grade_batch(submissions, assignment, sandbox, rubric, out_dir, args.workers, executor=executor,
                              meanwhile=load_matplotlib)
    except BatchInterrupted as stopped:   # nothing is left running; what was graded is written
        say(f"grader: {stopped}", sys.stderr)
        return stopped.exit_status
    except BatchError as exc:
        raise CommandError(f"{exc} (the results written so far are kept)") from exc
    if args.llm_guard and args.llm == "off":
        say("--llm-guard asks the model, and --llm is off: no second opinion was asked "
            "(the grader's own detector still flagged what it recognizes)", sys.stderr)
    if args.llm != "off":
        overrides = {"model": args.llm_model, "max_tokens": args.llm_max_tokens, "concurrency": args.llm_concurrency,
                     "max_retries": args.llm_retries}
        llm = replace(rubric.llm, **{k: v for k, v in overrides.items() if v is not None})
        written = grade_written(out_dir, outcome.results, assignment, replace(rubric, llm=llm), args.llm,
                                args.llm_budget, guard=args.llm_guard)
        say(written.note, sys.stderr)
    try:
        for line in apply_overrides(outcome.results, out_dir):
            say(f"override: {line}", sys.stderr)
    except OverrideError as exc:
        say(f"grader: {exc}", sys.stderr)
    for change in record_changes(out_dir, before, outcome.results):
        say(f"score changed: {change['submission_id']} {change['old_total']:g} -> {change['new_total']:g}",
            sys.stderr)
    if args.similarity == "on":   # before the pages, which show it; it changes no score and never fails the batch
        say(run_similarity(out_dir, outcome.results, assignment, [Path(p) for p in args.compare_with]), sys.stderr)
    else:   # an earlier run's comparison would describe another class
        for name in (SIMILARITY_FILE, SIMILARITY_PAGE):
            (out_dir / name).unlink(missing_ok=True)
    _write_outputs(out_dir, outcome.results, release, assignment.root)
    if outcome.internal_errors:
        say(f"{counted(outcome.internal_errors, 'submission')} hit an internal grader error (tracebacks in "
            f"{out_dir}/<id>/{GRADER_ERRORS}; rerunning regrades them)", sys.stderr)
        return 2
    return 0


def _release(out_dir: Path, given: str | None) -> str:
    """The folder's release state: ``--release`` changes it, omitted keeps it."""
    try:
        return release_state(out_dir, given)
    except ValueError as exc:
        raise CommandError(str(exc)) from exc


def _write_outputs(out_dir: Path, results: list[GradeResult], release: str, root: Path | None = None) -> None:
    """Gradebook, pages and the closing table: the same after ``grade`` and ``report``. ``root``:
    the assignment's root (grade's; ``report`` reads the one the folder keeps)."""
    write_gradebook(out_dir, results)
    write_pages(out_dir, results, release, root)
    print_scores(results, sys.stdout)
    say(f"\nresults: {out_dir}/<id>/results.json and report.html; gradebook: {out_dir}/gradebook.csv; "
        f"for TAs: {out_dir}/{SUMMARY_PAGE}; released to students: {release} (--release changes it)")
    warning = released_while_waiting(results, release)
    if warning:
        say(warning, sys.stderr)


def released_while_waiting(results: list[GradeResult], release: str) -> str:
    """The warning for students shown items that still wait for a TA ("" when none is): with
    grades published, their pages count those items 0 until a TA decides them."""
    shown = RELEASES[release]
    waiting = [(r, i) for r in results for i in r.items if i.visibility in shown and is_pending(i)]
    if not waiting:
        return ""
    students = len({r.submission_id for r, _ in waiting})
    points = sum(i.max_score for _, i in waiting)
    return (f"grader: warning: released to students ({release}) while {counted(len(waiting), 'item')} of "
            f"{counted(students, 'submission')} ({points:g} points) still wait for a TA's review; "
            "their pages say so and count those points 0 until a TA decides them. Review them from "
            f"{SUMMARY_PAGE}'s queue, then run `grader report` again.")


def _cmd_report(args: argparse.Namespace) -> int:
    out_dir = Path(args.dir)
    results = read_results(out_dir)
    if not results:
        raise CommandError(f"{out_dir}: no results.json files to report on")
    release = _release(out_dir, args.release)
    try:
        log = apply_overrides(results, out_dir)
    except OverrideError as exc:
        raise CommandError(str(exc)) from exc
    for line in log:
        say(f"override: {line}")
    _write_outputs(out_dir, results, release)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    out_dir = Path(args.dir)
    results = read_results(out_dir)
    if not results:
        raise CommandError(f"{out_dir}: no results.json files to export")
    target = Path(args.out) if args.out else out_dir / f"{args.format}_import.csv"
    try:
        outcome = export_canvas(results, Path(args.roster), args.column, target)
    except ExportError as exc:
        raise CommandError(str(exc)) from exc
    say(f"wrote {outcome.path}: {outcome.exported} students")
    for label, ids in (("graded but not in the roster (not exported)", outcome.not_in_roster),
                       ("in the roster without a submission (left empty)", outcome.no_submission),
                       (f"of {outcome.exported} exported totals still wait for review of written answers "
                        "(exported as their graded points; export again after review)", outcome.pending_review)):
        if ids:
            say(f"{len(ids)} {label}: {', '.join(ids)}", sys.stderr)
    return 0


def _cmd_publish(args: argparse.Namespace) -> int:
    """Final totals and pages into a Canvas assignment: a dry run unless --apply; 1 when some
    student could not be posted (listed), 130 when interrupted (what was posted is recorded)."""
    from grader.report import canvas   # canvasapi and requests load for this command only

    out_dir = Path(args.dir)
    try:
        where = canvas.target(args.canvas, args.course, args.assignment)
        token = canvas.token_from_environment()
        grades = canvas.plan(out_dir, Path(args.roster), where)
        say(f"{'publishing' if args.apply else 'dry run, nothing is posted (--apply posts)'}: {out_dir} to "
            f"{where.key}")
        for sid, why in grades.held.items():
            say(f"not posted: {sid}: {why}", sys.stderr)
        if grades.no_submission:
            say(f"{counted(len(grades.no_submission), 'roster student')} without a submission (nothing posted): "
                f"{', '.join(grades.no_submission)}", sys.stderr)
        if grades.unchanged:
            say(f"unchanged since posted ({canvas.PUBLISHED_FILE}): {', '.join(grades.unchanged)}")
        if not grades.to_post:
            say("nothing to post")
            return 0
        assignment = canvas.open_assignment(where, token)
        warning = canvas.points_mismatch(assignment, grades)
        if warning:
            say(f"grader: {warning}", sys.stderr)
        outcome = canvas.publish_grades(grades, assignment, out_dir, where, args.apply, say)
    except canvas.PublishError as exc:
        raise CommandError(str(exc)) from exc
    except KeyboardInterrupt:
        say(f"grader: interrupted; every student posted is recorded in {out_dir / canvas.PUBLISHED_FILE}, and the "
            "same command posts the rest", sys.stderr)
        return 130
    for sid, why in outcome.failed.items():
        say(f"not posted: {sid}: {why}", sys.stderr)
    done = (f"posted {counted(len(outcome.posted), 'student')}" if args.apply else
            f"would post {counted(len(grades.to_post) - len(outcome.failed) - len(outcome.already_there), 'student')}")
    say(f"{done}; {len(outcome.already_there)} already in Canvas, {len(outcome.failed)} failed, "
        f"{len(grades.held)} held back, {len(grades.unchanged)} unchanged")
    return 1 if outcome.failed else 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    assignment, rubric = _assignment(args)
    path = Path(args.samples) if args.samples else assignment.root / "rubrics" / f"{assignment.name}_calibration.yaml"
    try:
        samples = load_samples(path, assignment)
        report = calibrate(assignment, rubric, samples, Path(args.out), args.llm)
    except RubricError as exc:
        raise CommandError(str(exc)) from exc
    say(report_table(report))
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    assignment, rubric = _assignment(args)
    sandbox = make_sandbox(rubric.limits, args.allow_unsandboxed, args.isolation, hidden_paths(assignment),
                           _installed_requirements(assignment, rubric))
    report = validate(assignment, sandbox, rubric)
    say(report.text)
    return 0 if report.ok else 1


CHECK_SCRIPT = assign.CHECK_SCRIPT


def _cmd_check(args: argparse.Namespace) -> int:
    """Run the assignment's own check.py, the script students run, so that a TA sees exactly what
    the student sees; it runs only the public tests (and with --run the notebook), never a hidden
    check. Both run the notebook's code, so check.py runs in the grading sandbox, on copies of the
    assignment folder and of the notebook in its scratch: 0 when check.py finds the notebook
    ready, else 1."""
    root = _root(args)
    name = args.assignment or _assignment_of(Path(args.notebook), root)
    assignment = Assignment(name, root)
    folder = assignment.template_path.parent
    if not (folder / CHECK_SCRIPT).is_file():
        raise CommandError(f"assignment {name!r} ships no {CHECK_SCRIPT} (looked for {folder / CHECK_SCRIPT})")
    notebook = Path(args.notebook)
    if not notebook.exists():
        raise CommandError(f"{notebook}: no such notebook")
    problem = assignment.check_files()
    if problem:
        raise CommandError(problem)
    try:
        limits = assignment.rubric.limits
    except RubricError as exc:
        raise CommandError(str(exc)) from exc
    try:   # through intake, as grading reads it: a regular file, capped (the TA's path may be a link)
        data = read_file(notebook.resolve(), notebook.resolve().parent, int(limits.notebook_max_mib * 2**20),
                         str(notebook))
    except Refused as exc:
        say(f"grader: {exc}", sys.stderr)
        return 1
    sandbox = make_sandbox(limits, args.allow_unsandboxed, args.isolation, hidden_paths(assignment),
                           _installed_requirements(assignment, assignment.rubric))
    with tempfile.TemporaryDirectory(prefix="g2c-check-") as tmp:
        scratch = Path(tmp).resolve()
        shutil.copytree(folder, scratch / name, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
        # In a folder of its own, so that no name of the TA's can clash with the assignment's files.
        (scratch / "notebook").mkdir()
        copy = scratch / "notebook" / f"{safe_id(notebook.stem)}.ipynb"
        copy.write_bytes(data)
        # check.py's pytest lists every folder above tests/ that is not above check.py's temporary
        # folder (pytest's confcutdir); bwrap's folders above scratch cannot be listed, so that
        # temporary folder goes in scratch too.
        (scratch / "tmp").mkdir()
        command = [sys.executable, str(scratch / name / CHECK_SCRIPT), str(copy),
                   *(["--run"] if args.run_notebook else [])]
        result = sandbox.run(command, scratch=scratch, env={"TMPDIR": str(scratch / "tmp")})
        # The paths of the copies, gone with scratch, as the TA knows them.
        given = {str(copy): str(notebook), str(scratch / name): str(folder)}
    # Plain here too, not only in check.py: the notebook's code ran in the same sandbox, on the same output.
    say(as_given(result.stdout, given), end="")
    say(as_given(result.stderr, given), sys.stderr, end="")
    for reason in result.stopped:
        say(f"grader: the sandbox stopped {CHECK_SCRIPT}: {reason}", sys.stderr)
    return 0 if result.returncode == 0 else 1


def as_given(text: str, paths: dict[str, str]) -> str:
    """``text`` with each temporary path of ``paths`` (a copy in scratch, gone once the command
    ends) named as the path the TA gave, longest first, where it stands as a whole path."""
    for temporary in sorted(paths, key=len, reverse=True):
        text = re.sub(re.escape(temporary) + r"(?![\w.-])", lambda _: paths[temporary], text)
    return text


def _assignment_of(notebook: Path, root: Path) -> str:
    """Whose check.py runs on ``notebook``: the one assignment under ``root`` that ships one, else
    the one whose student notebook shares the most cell ids with it (the grader matches cells by
    id too)."""
    found = sorted(p.parent.name for p in (root / "assignments").glob(f"*/{CHECK_SCRIPT}"))
    if len(found) == 1:
        return found[0]
    try:
        path = notebook.resolve()
        cap = int(Limits().notebook_max_mib * 2**20)   # the rubric's default; the check itself applies the real one
        cells_of = json.loads(read_file(path, path.parent, cap, str(notebook))).get("cells")
        ids = {c.get("id") for c in cells_of if isinstance(c, dict)} if isinstance(cells_of, list) else set()
    except (Refused, ValueError, RecursionError, AttributeError, TypeError):
        ids = set()
    shared = {name: len(ids & _template_ids(name, root)) for name in found}
    best = [name for name, count in shared.items() if count and count == max(shared.values())]
    if len(best) != 1:
        raise CommandError(f"which assignment's {CHECK_SCRIPT}? {notebook} matches "
                           f"{' and '.join(best) if best else 'none'} of {', '.join(found)}; pass --assignment NAME")
    return best[0]


def _template_ids(name: str, root: Path) -> set[str]:
    try:
        return {c.get("id") for c in Assignment(name, root).template.cells}
    except (OSError, ValueError):   # a folder with a check.py and no readable notebook matches nothing
        return set()


def _cmd_gradescope_bundle(args: argparse.Namespace) -> int:
    from grader.gradescope import write_bundle   # only this command needs it

    target = Path(args.out)
    try:
        names = write_bundle(Assignment(args.assignment, _root(args)), target)
    except ValueError as exc:
        raise CommandError(str(exc)) from exc
    say(f"wrote {target} ({len(names)} files): upload it as the assignment's Gradescope autograder")
    return 0


def _add_release_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--release", choices=tuple(RELEASES), default=None,
                        help="what students' report.html shows, kept in the output folder until changed: none "
                             "(visible items only, a new folder's state), due (+ after_due_date items), "
                             "published (+ after_published, e.g. written answers)")


def _add_isolation_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allow-unsandboxed", action="store_true",
                        help="run student code without bubblewrap when it is unusable (unsafe)")
    parser.add_argument("--isolation", choices=("auto", *ISOLATION_LEVELS), default="auto",
                        help="auto: bubblewrap, else (as root, with the grader's files readable by root "
                             "only) an unprivileged user, else refuse (none with --allow-unsandboxed)")


def _add_assignment_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--assignment", required=True, help="assignment name: rubrics/NAME.yaml, solutions/NAME/, assignments/NAME/")
    parser.add_argument("--assignment-root", metavar="DIR",
                        help="the folder holding those three (default: this project); the rubric's checks "
                             "module is looked up in DIR/checks/ (MODULE.py or a package) first, then imported")


def _add_grading_options(parser: argparse.ArgumentParser) -> None:
    _add_assignment_options(parser)
    _add_isolation_options(parser)
    limits = parser.add_argument_group("limits (default: the rubric's)")
    limits.add_argument("--memory-gib", type=float)
    limits.add_argument("--cpu-seconds", type=int)
    limits.add_argument("--max-processes", type=int)
    limits.add_argument("--file-size-mib", type=int)
    limits.add_argument("--disk-mib", type=int)
    limits.add_argument("--cell-output-kib", type=int)
    limits.add_argument("--cell-timeout", type=float, help="seconds per cell")
    limits.add_argument("--notebook-timeout", type=float, help="seconds per notebook")
    limits.add_argument("--idle-timeout", type=float,
                        help="seconds a cell, a probe case or a run may go without CPU progress before it is "
                             "stopped as hung")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="grader", description="Grade students' notebooks: lay out and hand out an assignment (new, "
        "import, assign, validate), grade submissions (grade), review and publish (report, export, "
        "publish), calibrate the written answers' model (calibrate), check a notebook as a student "
        "would (check), bundle for Gradescope (gradescope-bundle).",
        epilog="Exit status: 0 when the command did its job (whatever the scores); 1 when validate finds "
               "the solution or template graded wrongly, check finds the notebook not ready, or publish "
               "could not post some student; 2 when the grader itself could not run; 128 + N when signal N "
               "stopped grade or publish.")
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("assign", help="write the student notebook and its check.py from a master notebook")
    p.add_argument("master", help="solutions/<name>/<name>.ipynb")
    p.add_argument("--out", help="the notebook's path (default ROOT/assignments/<name>/<name>.ipynb); "
                                 "check.py goes beside it")
    p.add_argument("--assignment-root", metavar="ROOT",
                   help="where assignments/ goes (default: the master's own root, two folders above solutions/<name>/)")
    p.set_defaults(run=_cmd_assign)

    p = commands.add_parser("new", help="lay out a new assignment: a master notebook with test cells, its rubric, "
                                        "its student notebook and check.py")
    p.add_argument("name", help="the assignment's name (letters, digits and _)")
    p.add_argument("--out", "--assignment-root", dest="out", default=".", metavar="ROOT",
                   help="the assignment root to write solutions/, rubrics/ and assignments/ under (default: here); "
                        "the other commands' --assignment-root")
    p.set_defaults(run=_cmd_new)

    p = commands.add_parser("import", help="an otter-assign master notebook or an nbgrader source notebook as an "
                                           "assignment: master, rubric, student notebook and check.py")
    p.add_argument("format", choices=("otter", "nbgrader"), help="whose format the notebook is in")
    p.add_argument("notebook", help="otter's master notebook, or nbgrader's source notebook")
    p.add_argument("--out", "--assignment-root", dest="out", required=True, metavar="ROOT",
                   help="the assignment root to write solutions/, rubrics/ and assignments/ under")
    p.add_argument("--name", help="the assignment's name (default: otter's config name, else the notebook's name)")
    p.set_defaults(run=_cmd_import)

    p = commands.add_parser("grade", help="grade notebooks or folders of submissions")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--workers", type=int, default=default_workers(), help="parallel submissions")
    p.add_argument("--executor", choices=("local", "dask"), default="local",
                   help="local: a pool of worker processes here; dask: a Dask cluster (needs the dask extra), "
                        "a LocalCluster of --workers processes unless --scheduler is given")
    p.add_argument("--scheduler", metavar="tcp://HOST:PORT",
                   help="with --executor dask: the scheduler whose workers grade (see docs/dask.md: the same "
                        "grader checkout on every worker; keep the scheduler on a private network or behind TLS)")
    llm = p.add_argument_group("written answers (LLM grading; needs ANTHROPIC_API_KEY)")
    llm.add_argument("--llm", choices=("off", "live", "batch"), default="off",
                     help="off: pending_review; live: one request per answer; batch: one Message Batch "
                          "(half price, resumable)")
    llm.add_argument("--llm-budget", type=float, metavar="USD", help="stop sending once the estimate would pass this")
    llm.add_argument("--llm-model", help="default: the rubric's written.model")
    llm.add_argument("--llm-max-tokens", type=int, help="default: the rubric's written.max_tokens")
    llm.add_argument("--llm-concurrency", type=int, help="live requests in flight (default: the rubric's)")
    llm.add_argument("--llm-retries", type=int, help="retries per request (default: the rubric's)")
    llm.add_argument("--llm-guard", action="store_true",
                     help="a second opinion: one more request per answer, with no rubric, asking only whether it "
                          "addresses the grader; a yes flags it (cached, counted in the cost and the budget)")
    p.add_argument("--similarity", choices=("on", "off"), default="on",
                   help="on: compare the class's code and written answers, pair by pair, into DIR/similarity.json "
                        "and DIR/similarity.html, for a person to look at (no score changes); off: skip it")
    p.add_argument("--compare-with", nargs="+", default=[], metavar="DIR",
                   help="earlier terms' graded folders, compared with this class (never among themselves)")
    _add_release_option(p)
    _add_grading_options(p)
    p.set_defaults(run=_cmd_grade)

    p = commands.add_parser("report", help="apply TA overrides and re-render gradebook and pages")
    p.add_argument("dir", help="the output folder of a grade run")
    _add_release_option(p)
    p.set_defaults(run=_cmd_report)

    p = commands.add_parser("export", help="a gradebook CSV that an LMS imports")
    p.add_argument("dir", help="the output folder of a grade run")
    p.add_argument("--roster", required=True, help="CSV: submission_id, then Canvas's Student, ID, SIS User ID, "
                                                    "SIS Login ID, Section")
    p.add_argument("--format", choices=("canvas",), default="canvas")
    p.add_argument("--column", required=True, help="the assignment's Canvas column header, 'Name (assignment id)'")
    p.add_argument("--out", help="default: DIR/canvas_import.csv")
    p.set_defaults(run=_cmd_export)

    p = commands.add_parser("publish", help="post final totals, each with the student's page, to a Canvas "
                                            "assignment through its API (needs CANVAS_API_TOKEN); a dry run "
                                            "unless --apply")
    p.add_argument("dir", help="the output folder of a grade run")
    p.add_argument("--canvas", required=True, metavar="URL", help="your Canvas's address, https://canvas.example.edu")
    p.add_argument("--course", required=True, metavar="ID", help="the course's Canvas id (the number in its address)")
    p.add_argument("--assignment", required=True, metavar="ID", help="the assignment's Canvas id")
    p.add_argument("--roster", required=True, help="export's roster CSV: submission_id, then Canvas's Student, "
                                                    "ID (the Canvas user id), SIS User ID, SIS Login ID, Section")
    p.add_argument("--apply", action="store_true",
                   help="post, recording each student in DIR/published.json (default: print what would change)")
    p.set_defaults(run=_cmd_publish)

    p = commands.add_parser("calibrate", help="agreement of the LLM's drafts with TA-scored sample answers")
    p.add_argument("--samples", help="default: rubrics/<assignment>_calibration.yaml")
    p.add_argument("--out", default="out/calibration", help="where the samples' drafts (and cache) go")
    p.add_argument("--llm", choices=("live", "batch"), default="live")
    _add_grading_options(p)
    p.set_defaults(run=_cmd_calibrate)

    p = commands.add_parser("validate", help="the solution earns every point, the template the baseline")
    _add_grading_options(p)
    p.set_defaults(run=_cmd_validate)

    p = commands.add_parser("gradescope-bundle", help="autograder.zip for a Gradescope programming assignment")
    _add_assignment_options(p)
    p.add_argument("--out", default="autograder.zip", help="target path (default ./autograder.zip)")
    p.set_defaults(run=_cmd_gradescope_bundle)

    p = commands.add_parser("check", help="run an assignment's check.py on a notebook, as a student would, "
                                          "in the grading sandbox")
    p.add_argument("notebook", help="the notebook to check")
    p.add_argument("--assignment", help="whose check.py (default: the assignment whose notebook it matches)")
    p.add_argument("--assignment-root", metavar="DIR", help="the folder holding assignments/ (default: this project)")
    p.add_argument("--run", action="store_true", dest="run_notebook",
                   help="check.py --run: also run the notebook as grading does")
    _add_isolation_options(p)
    p.set_defaults(run=_cmd_check)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (CommandError, NoSandbox) as exc:
        say(f"grader: {exc}", sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
