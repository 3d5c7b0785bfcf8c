#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu): the
# bundle is unpacked in $AUTOGRADER_ROOT/source. It installs Python, bubblewrap (used when
# the container lets it create namespaces), the grader in a virtualenv and the assignment's own
# requirements, then locks the grader's files away from the unprivileged user that student code
# runs as (lock_down.sh). A requirement that cannot be installed fails the build, with pip's reason.
set -euo pipefail

# How torch is installed: the CPU wheels (no GPU on Gradescope), within pyproject.toml's range.
TORCH_PIP_ARGS=("torch>=2.13,<2.15" --index-url "https://download.pytorch.org/whl/cpu")

ROOT="${AUTOGRADER_ROOT:-/autograder}"
VENV="${AUTOGRADER_VENV:-$ROOT/venv}"

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq python3 python3-venv python3-pip bubblewrap util-linux

python3 -m venv "$VENV"
"$VENV/bin/pip" install --no-cache-dir --upgrade pip
"$VENV/bin/pip" install --no-cache-dir "${TORCH_PIP_ARGS[@]}"
# Not editable: the grader runs from the virtualenv, whose copy lock_down.sh makes root-only.
"$VENV/bin/pip" install --no-cache-dir "$ROOT/source"
# The assignment's own requirements (its rubric's settings.requirements; none: nothing happens),
# installed now, once, by the grader itself into $ROOT/envs, where the grading step looks for them:
# it never installs them. From /, so that the installed grader runs, not the source's.
(cd / && "$VENV/bin/python" -m grader.gradescope --assignment "@ASSIGNMENT@" --root "$ROOT" --install-requirements)

AUTOGRADER_ROOT="$ROOT" AUTOGRADER_VENV="$VENV" bash "$ROOT/source/lock_down.sh"
