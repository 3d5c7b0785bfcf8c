"""A small assignment graded by inline checks only: test cells of every form the grader
evaluates outside the student's process (``grader.checks.inline``), and submissions for it.

``write_assignment(root)`` lays it out as an assignment root (master, rubric, student
notebook and check.py from ``grader assign``); ``SUBMISSIONS`` holds scaffold cells: correct
ones in other styles, honest mistakes, and the tricks that fool checks run in the student's
process, each with the items it must earn.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import nbformat

from grader import assign, cells
from grader.assignment import Assignment

NAME = "inline_demo"
SCAFFOLD_ID = "functions"
SYMBOLS = ["softplus", "running_mean", "normalize", "count_words", "causal_mask", "first_negative"]

SOLUTION = '''
def softplus(x):
    """log(1 + e^x), elementwise, finite for large |x|."""
    ### BEGIN SOLUTION
    return np.logaddexp(0.0, x)
    ### END SOLUTION


def running_mean(x):
    """Row t is the mean of rows 0..t of the 2-D array x."""
    ### BEGIN SOLUTION
    return np.cumsum(x, axis=0) / np.arange(1, x.shape[0] + 1)[:, None]
    ### END SOLUTION


def normalize(v):
    """v scaled to unit length; ValueError for the zero vector."""
    ### BEGIN SOLUTION
    norm = np.linalg.norm(v)
    if norm == 0:
        raise ValueError("cannot normalize the zero vector")
    return v / norm
    ### END SOLUTION


def count_words(text):
    """How often each word occurs, in order of first occurrence; TypeError for a non-string."""
    ### BEGIN SOLUTION
    if not isinstance(text, str):
        raise TypeError("count_words takes a string")
    counts = {}
    for word in text.split():
        counts[word] = counts.get(word, 0) + 1
    return counts
    ### END SOLUTION


def causal_mask(n):
    """A bool tensor of shape (n, n), True where column <= row."""
    ### BEGIN SOLUTION
    return torch.ones(n, n, dtype=torch.bool).tril()
    ### END SOLUTION


def first_negative(values):
    """The index of the first negative value, or None."""
    ### BEGIN SOLUTION
    for index, value in enumerate(values):
        if value < 0:
            return index
    return None
    ### END SOLUTION
'''

PROVIDED_HELPER = '''def vector_length(v):
    """The Euclidean length of v (provided)."""
    return float(np.sqrt(np.sum(np.square(v))))
'''

# Test cells: (name, points, visibility, source). Every form the issue lists, none decided in
# the sandbox.
TESTS = [
    ("softplus_values", 2, "visible", '''
x = np.linspace(-30.0, 30.0, 61)
assert np.allclose(softplus(x), np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0.0))
for value in [-1000.0, 0.0, 1000.0]:
    assert math.isclose(softplus(value), max(value, 0.0) + math.log1p(math.exp(-abs(value))), rel_tol=1e-12)
assert abs(softplus(0.0) - math.log(2.0)) < 1e-12, "softplus(0) is log 2"
assert softplus(1.0) != softplus(2.0)
assert softplus(-5.0) < softplus(5.0) <= 5.01
'''),
    ("running_mean_matches", 2, "hidden", '''
def reference(x):
    return np.cumsum(x, axis=0) / np.arange(1, x.shape[0] + 1)[:, None]


rng = np.random.default_rng(7)
for rows in (1, 4, 9):
    x = rng.standard_normal((rows, 3))
    expected = reference(x)
    np.testing.assert_allclose(running_mean(x), expected, rtol=0, atol=1e-12)
'''),
    ("normalize_rejects_zero", 2, "visible", '''
import pytest

with pytest.raises(ValueError, match="zero"):
    normalize(np.zeros(3))
assert np.allclose(normalize(np.array([3.0, 4.0])), [0.6, 0.8])
'''),
    ("count_words_examples", 1, "after_published", '''
"""
>>> count_words("the cat the hat")
{'the': 2, 'cat': 1, 'hat': 1}
>>> print(count_words(""))
{}
>>> count_words(3)
Traceback (most recent call last):
    ...
TypeError: count_words takes a string
"""
'''),
    ("causal_mask_torch", 2, "hidden", '''
mask = causal_mask(4)
assert mask.dtype == torch.bool
assert mask.shape == (4, 4)
torch.testing.assert_close(mask, torch.tril(torch.ones(4, 4, dtype=torch.bool)))
'''),
    ("lookups", 1, "hidden", '''
assert isinstance(count_words("a"), dict)
assert "a" in count_words("a b")
assert first_negative([1, 2, 3]) is None
assert first_negative([4, -1, -2]) == 1
'''),
    # The forms a fourth hostile round read expected values from, when the test ran in the
    # student's process: a table of cases in a loop, a helper given the expected value, a case
    # that is the input's source too, and a provided helper applied after the student's call.
    ("table_cases", 1, "hidden", '''
cases = {"none": ([1, 2, 3], None), "second": ([4, -1, -2], 1), "last": ([0, 0, -5], 2)}
for values, want in cases.values():
    assert first_negative(values) == want
'''),
    ("helper_mean", 1, "hidden", '''
def check_mean(x, want):
    np.testing.assert_allclose(running_mean(x), want, rtol=0, atol=1e-12)


check_mean(np.array([[1.0], [3.0], [8.0]]), np.array([[1.0], [2.0], [4.0]]))
'''),
    ("case_source", 1, "hidden", '''
case = {"v": np.array([0.0, 2.0, 0.0]), "unit": np.array([0.0, 1.0, 0.0])}
assert np.allclose(normalize(case["v"]), case["unit"])
'''),
    ("unit_length", 1, "hidden", '''
out = normalize(np.array([1.0, 2.0, 2.0]))
assert math.isclose(vector_length(out), 1.0)
'''),
    # Comparisons that broadcast: an empty result is close to anything.
    ("empty_never_close", 1, "hidden", '''
assert np.allclose(running_mean(np.ones((4, 2))), 1.0)
assert torch.allclose(causal_mask(4).diagonal().double(), torch.tensor(1.0, dtype=torch.float64))
'''),
]

RUBRIC = f"""\
assignment: {NAME}
tags:
  execution: "the notebook runs headless"
  values: "a function's values"
limits:
  memory_gib: 2
  cpu_seconds: 120
  cell_timeout_s: 30
  notebook_timeout_s: 120
  probe_case_timeout_s: 30
  notebook_max_mib: 5
items:
  - {{name: notebook_runs, points: 1, tags: [execution], title: "notebook executes headless", baseline: true}}
"""


def master_notebook() -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook.cells = [
        nbformat.v4.new_markdown_cell("# Inline checks\n\nSix small functions.", id="intro"),
        nbformat.v4.new_code_cell("import math\n\nimport numpy as np\nimport torch", id="imports",
                                  metadata={"tags": [cells.PROVIDED]}),
        nbformat.v4.new_code_cell(PROVIDED_HELPER, id="helpers", metadata={"tags": [cells.PROVIDED]}),
        nbformat.v4.new_code_cell(SOLUTION.strip() + "\n", id=SCAFFOLD_ID,
                                  metadata={"tags": [cells.SCAFFOLD], "g2c": {"symbols": SYMBOLS}}),
    ]
    for name, points, visibility, source in TESTS:
        notebook.cells.append(nbformat.v4.new_code_cell(
            source.strip() + "\n", id=f"test-{name}".replace("_", "-"),
            metadata={"tags": [cells.TEST], "g2c": {"test": {"name": name, "points": points, "visibility": visibility,
                                                            "tags": ["values"]}}}))
    return notebook


def write_assignment(root: Path) -> Assignment:
    """The assignment under ``root``: master, rubric, then the student files from them."""
    master = root / "solutions" / NAME / f"{NAME}.ipynb"
    master.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(master_notebook(), str(master))
    (root / "rubrics").mkdir(exist_ok=True)
    (root / "rubrics" / f"{NAME}.yaml").write_text(RUBRIC, encoding="utf-8")
    assign.write_student_files(master, assign.student_path(master, root))
    return Assignment(NAME, root)


def scaffold(**replaced: str) -> str:
    """The master's scaffold cell with the named functions replaced by the given sources."""
    source = SOLUTION.strip() + "\n"
    blocks = {}
    for chunk in ("\n\n\n" + source).split("\n\n\ndef ")[1:]:
        blocks[chunk.split("(", 1)[0]] = "def " + chunk.rstrip() + "\n"
    for name, code in replaced.items():
        assert name in blocks, name
        blocks[name] = textwrap.dedent(code).strip() + "\n"
    return "\n\n".join(blocks[name] for name in SYMBOLS)


ALL = frozenset(name for name, *_ in TESTS)

# id -> (scaffold cell, the test items it must earn). Correct in other styles, then mistakes.
CORRECT = {
    "torch_style": (scaffold(softplus='''
        def softplus(x):
            return torch.nn.functional.softplus(torch.as_tensor(x, dtype=torch.float64)).numpy()
        ''', running_mean='''
        def running_mean(x):
            out = np.empty_like(x)
            total = np.zeros(x.shape[1])
            for t in range(x.shape[0]):
                total = total + x[t]
                out[t] = total / (t + 1)
            return out
        ''', causal_mask='''
        def causal_mask(n):
            rows = torch.arange(n)
            return rows[:, None] >= rows[None, :]
        '''), ALL),
    "plain_python": (scaffold(softplus='''
        def softplus(x):
            return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))
        ''', count_words='''
        def count_words(text):
            if type(text) is not str:
                raise TypeError("count_words takes a string")
            found = dict()
            for word in text.split():
                found.setdefault(word, 0)
                found[word] += 1
            return found
        ''', first_negative='''
        def first_negative(values):
            return next((i for i, v in enumerate(values) if v < 0), None)
        '''), ALL),
}
MISTAKES = {
    "naive_softplus": (scaffold(softplus='''
        def softplus(x):
            return np.log1p(np.exp(x))
        '''), ALL - {"softplus_values"}),
    "off_by_one_mean": (scaffold(running_mean='''
        def running_mean(x):
            return np.cumsum(x, axis=0) / np.arange(x.shape[0])[:, None].clip(min=1)
        '''), ALL - {"running_mean_matches", "helper_mean", "empty_never_close"}),
    "no_zero_check": (scaffold(normalize='''
        def normalize(v):
            return v / np.linalg.norm(v)
        '''), ALL - {"normalize_rejects_zero"}),
    "counter": (scaffold(count_words='''
        def count_words(text):
            import collections
            if not isinstance(text, str):
                raise TypeError("count_words takes a string")
            return collections.Counter(text.split())
        '''), ALL - {"count_words_examples"}),
    "float_mask": (scaffold(causal_mask='''
        def causal_mask(n):
            return torch.ones(n, n).tril()
        '''), ALL - {"causal_mask_torch"}),
}
# The tricks that fool a test run in the student's process; each is wrong code besides, so it
# must lose exactly the items it tries to fool.
HOSTILE = {
    "patched_comparisons": (scaffold(softplus='''
        def softplus(x):
            np.allclose = lambda *args, **kwargs: True
            math.isclose = lambda *args, **kwargs: True
            np.isclose = lambda *args, **kwargs: True
            return x * 0.5
        '''), ALL - {"softplus_values"}),
    "always_equal": (scaffold(first_negative='''
        def first_negative(values):
            class Anything(int):
                def __eq__(self, other):
                    return True
                __hash__ = int.__hash__
            return Anything(7)
        '''), ALL - {"lookups", "table_cases"}),
    "repr_prints_expected": (scaffold(count_words='''
        def count_words(text):
            class Printed:
                def __repr__(self):
                    return "{'the': 2, 'cat': 1, 'hat': 1}"
                def __str__(self):
                    return "{}"
            if not isinstance(text, str):
                raise TypeError("count_words takes a string")
            return Printed()
        '''), ALL - {"count_words_examples", "lookups"}),
    "silenced_traceback": (scaffold(running_mean='''
        def running_mean(x):
            import sys
            sys.excepthook = lambda *args: None
            sys.stderr = open("/dev/null", "w")
            sys.exit(0)
        '''), ALL - {"running_mean_matches", "helper_mean", "empty_never_close"}),
    "raises_to_skip": (scaffold(causal_mask='''
        def causal_mask(n):
            import unittest
            raise unittest.SkipTest("skipped")
        '''), ALL - {"causal_mask_torch", "empty_never_close"}),
    "swapped_module_attributes": (scaffold(running_mean='''
        def running_mean(x):
            np.cumsum = lambda a, axis=None: a
            np.testing.assert_allclose = lambda *args, **kwargs: None
            return x
        ''', softplus='''
        def softplus(x):
            np.log1p = lambda a: np.maximum(a, 0) * 0
            np.exp = lambda a: a
            return np.maximum(x, 0)
        '''), ALL - {"running_mean_matches", "softplus_values", "helper_mean"}),
    "reads_expected_from_frames": (scaffold(running_mean='''
        def running_mean(x):
            import sys
            frame = sys._getframe(1)
            while frame is not None:
                for scope in (frame.f_locals, frame.f_globals):
                    found = scope.get("expected")
                    if isinstance(found, np.ndarray) and found.shape == x.shape:
                        return found
                frame = frame.f_back
            return x
        '''), ALL - {"running_mean_matches", "helper_mean"}),
}
# A fourth round: each reaches a value of the test's, or the grader's recording, from the
# student's code, and passed its item with wrong code while the test ran in the student's process.
FOURTH_ROUND = {
    "frames_table": (scaffold(first_negative='''
        def first_negative(values):
            import sys
            frame = sys._getframe(1)
            while frame is not None:
                if "want" in frame.f_locals:
                    return frame.f_locals["want"]
                frame = frame.f_back
            return -1
        '''), ALL - {"lookups", "table_cases"}),
    "frames_helper": (scaffold(running_mean='''
        def running_mean(x):
            import sys
            frame = sys._getframe(1)
            while frame is not None:
                if "want" in frame.f_locals:
                    return frame.f_locals["want"]
                frame = frame.f_back
            return x
        '''), ALL - {"running_mean_matches", "helper_mean"}),
    "frames_case_source": (scaffold(normalize='''
        def normalize(v):
            import sys
            frame = sys._getframe(1)
            while frame is not None:
                case = frame.f_globals.get("case")
                if isinstance(case, dict) and "unit" in case:
                    return case["unit"]
                frame = frame.f_back
            return v
        '''), ALL - {"normalize_rejects_zero", "case_source", "unit_length"}),
    "rebinds_provided_helper": (scaffold(normalize='''
        def normalize(v):
            globals()["vector_length"] = lambda v: 1.0
            norm = np.linalg.norm(v)
            if norm == 0:
                raise ValueError("cannot normalize the zero vector")
            return 2 * v / norm
        '''), ALL - {"normalize_rejects_zero", "case_source", "unit_length"}),
    "scans_own_memory": (scaffold(first_negative='''
        def first_negative(values):
            import re
            table = re.compile(rb"'l.st': \\(\\[0, 0, -5\\], 2\\)")   # the test's table as the sandbox's program spells it
            seen = False
            with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as memory:
                for line in maps:
                    parts = line.split()
                    start, end = (int(x, 16) for x in parts[0].split("-"))
                    if not parts[1].startswith("rw") or end - start > 1 << 28:
                        continue
                    try:
                        memory.seek(start)
                        seen = table.search(memory.read(end - start)) is not None
                    except (OSError, OverflowError, ValueError):
                        continue
                    if seen:
                        break
            if not seen:
                return -1
            for index, value in enumerate(values):   # it found the table: as good as reading its answers
                if value < 0:
                    return index
            return None
        '''), ALL - {"lookups", "table_cases"}),
    "wraps_the_recorder": (scaffold(normalize='''
        def normalize(v):
            scope = globals()
            original = scope.get("__g2c_raised__")
            if original is not None and not getattr(original, "wrapped", False):
                def wrapper(site, exc, *values):
                    return original(site, exc if exc is not None else ValueError("cannot normalize the zero vector"),
                                    *values)
                wrapper.wrapped = True
                scope["__g2c_raised__"] = wrapper
            with np.errstate(all="ignore"):
                return v / np.linalg.norm(v)
        '''), ALL - {"normalize_rejects_zero"}),
    "empty_results": (scaffold(running_mean='''
        def running_mean(x):
            return np.empty((0, x.shape[1]))
        ''', causal_mask='''
        def causal_mask(n):
            return torch.ones(0, 0, dtype=torch.bool)
        '''), ALL - {"running_mean_matches", "causal_mask_torch", "helper_mean", "empty_never_close"}),
}
SUBMISSIONS = {**CORRECT, **MISTAKES, **HOSTILE, **FOURTH_ROUND}


def submission_notebook(assignment: Assignment, scaffold_cell: str) -> nbformat.NotebookNode:
    """The student notebook with ``scaffold_cell`` as its scaffold cell, as a student saves it."""
    notebook = nbformat.read(str(assignment.template_path), as_version=4)
    for cell in notebook.cells:
        if cell.get("id") == SCAFFOLD_ID:
            cell.source = scaffold_cell
    return notebook
