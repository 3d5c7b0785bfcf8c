"""Scripts that run INSIDE the sandbox, next to untrusted code.

They are copied into a submission's scratch directory and run with the sandbox's Python; the
``grader`` package itself is not importable there. They hold no expected values and decide
no verdicts: they only feed inputs to student code and write raw outputs (npy / JSON).
"""
from pathlib import Path

HARNESS_DIR = Path(__file__).parent

# What these scripts import beyond the standard library, and the kernel the notebook driver
# starts: the sandbox's Python must be able to import all of them as whatever user it runs.
SANDBOX_IMPORTS = ("nbformat", "nbclient", "ipykernel", "numpy", "torch")
