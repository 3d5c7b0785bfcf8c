"""The ``grader`` command line: assign, grade, report, validate."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grader import assign


def _cmd_assign(args: argparse.Namespace) -> int:
    master = Path(args.master)
    target = Path(args.out) if args.out else assign.student_path(master.resolve(), Path.cwd())
    assign.write_student_notebook(master, target)
    print(f"wrote {target}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grader", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    p = commands.add_parser("assign", help="write the student notebook from a master notebook")
    p.add_argument("master", help="solutions/<name>/<name>.ipynb")
    p.add_argument("--out", help="target path (default assignments/<name>/<name>.ipynb)")
    p.set_defaults(run=_cmd_assign)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
