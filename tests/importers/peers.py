"""The peers `grader import` reads, as oracles: otter-grader and nbgrader, each in the venv of
its own that `make peers` builds (out/peers/, never .venv: they pin other jupyter packages).
A test that needs one builds it through make when it is missing, so it never skips."""
from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / "out" / "peers"


def peer_bin(venv: str, program: str) -> Path:
    """``program`` of the peer's venv (``otter-venv`` or ``nbgrader-venv``), built by `make peers` if needed."""
    if not (PEERS / venv / ".installed").is_file():
        PEERS.mkdir(parents=True, exist_ok=True)
        with open(PEERS / ".lock", "w") as lock:   # two test processes may both find it missing
            fcntl.flock(lock, fcntl.LOCK_EX)
            done = subprocess.run(["make", "-s", "peers"], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, f"make peers failed: {done.stderr[-2000:]}"
    return PEERS / venv / "bin" / program


def peer_env(program: Path) -> dict[str, str]:
    """The environment a peer's command runs in: its venv first on PATH, nothing of ours."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join([str(program.parent), env.get("PATH", "")])
    return env
