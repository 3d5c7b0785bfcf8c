"""``grader`` as its entry point runs it, plus the coordinator's own peak memory at exit.

``python bench/coordinator.py grade ...`` calls ``grader.cli.main`` with the arguments and, as
it exits, prints ``bench: coordinator peak RSS KiB N`` on stderr: ``getrusage(RUSAGE_SELF)``'s
``ru_maxrss``, the grading process alone (its workers are other processes).
"""
from __future__ import annotations

import resource
import sys

from grader.cli import main

PEAK_LINE = "bench: coordinator peak RSS KiB"

if __name__ == "__main__":
    try:
        status = main(sys.argv[1:])
    finally:
        print(f"{PEAK_LINE} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}", file=sys.stderr)
    sys.exit(status)
