#!/usr/bin/env bash
# The file permissions that the sandbox's unprivileged-user isolation relies on (see
# grader/sandbox/): student code runs as an unprivileged uid that must run the Python of
# the virtualenv but read nothing of the grader's. Run as root by setup.sh, after installing,
# and by the tests on an unpacked bundle; running it again changes nothing.
#   - the bundle (the grader's source with the hidden checks, solutions, rubrics): root only;
#   - the virtualenv: readable by all, except the installed grader package: root only;
#   - the assignment's installed requirements ($ROOT/envs, outside the bundle because student
#     code imports them): readable by all, writable by root only;
#   - the autograder root: traversable (the virtualenv lies in it), not listable.
# The grading step closes the per-submission files itself (its output folder, the results
# folder, the submission metadata) before any student code runs, and checks all of this.
set -euo pipefail

ROOT="${AUTOGRADER_ROOT:-/autograder}"
VENV="${AUTOGRADER_VENV:-$ROOT/venv}"

chown -R root:root "$ROOT/source"
chmod -R go-rwx "$ROOT/source"

# Only what lacks the bits is changed: files that are readable by all already stay untouched.
find "$VENV" -path "$VENV/lib/python3*/site-packages/grader" -prune -o \
  \( -type d ! -perm -o=rx -exec chmod o+rx {} + \) -o \
  \( -type f ! -perm -o=r -exec chmod o+rX {} + \)
for package in "$VENV"/lib/python3*/site-packages/grader; do
  if [ -d "$package" ]; then
    chown -R root:root "$package"
    chmod -R go-rwx "$package"
  fi
done

if [ -d "$ROOT/envs" ]; then
  chown -R root:root "$ROOT/envs"
  chmod -R go-w,a+rX "$ROOT/envs"
fi

chmod 0711 "$ROOT"
