"""What the student reads of an inline test: the notes of a test decided in the sandbox, and how
a check's operands are shown (their summaries, where two arrays differ)."""
from __future__ import annotations

from typing import Any

import numpy as np

from grader.checks.compare import compare, describe
from grader.checks.inline.sites import Site


SANDBOX_NOTE = ("decided inside your code's process: this test's form cannot be compared outside it, "
                "so its result is what your code's process computed")
SANDBOX_PASS = ("{checks} passed inside your code's process, which cannot decide this test alone (its form "
                "cannot be compared outside it): a TA confirms it before it earns points")


def _times(count: int, noun: str = "time") -> str:
    return f"{count} {noun}{'s' if count != 1 else ''}"


def _operands(site: Site, values: list[Any]) -> str:
    """What each operand was, the student's first: pytest's "where" lines, shortened."""
    order = sorted(range(len(values)), key=lambda i: not site.tainted[i])
    shown = [f"`{site.operands[i]}` is {_summary(values[i])}" for i in order   # not functions, nor literals
             if not callable(values[i]) and not isinstance(values[i], type) and site.operands[i] != repr(values[i])][:3]
    arrays = [i for i in order if _as_float_array(values[i]) is not None]
    detail = ""
    if len(arrays) >= 2:   # the student's first array against the next: where and by how much
        got, expected = (_as_float_array(values[i]) for i in arrays[:2])
        detail = "; " + describe(compare(got, expected))
    return (": " + "; ".join(shown) if shown else "") + detail


def _as_float_array(value: Any) -> np.ndarray | None:
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return value.astype(np.float64)
    if type(value).__module__ == "torch" and type(value).__name__ == "Tensor":
        return value.detach().double().numpy()
    return None


def _summary(value: Any) -> str:
    array = _as_float_array(value)
    if array is not None:
        kind = "a tensor" if not isinstance(value, np.ndarray) else "an array"
        # NaN and infinities fail every closeness check: name them, or the failure reads like a shape problem
        bad = [f"{count} {what}" for count, what in ((int(np.isnan(array).sum()), "NaN"),
                                                     (int(np.isinf(array).sum()), "infinite")) if count]
        return (f"{kind} of shape {tuple(array.shape)}, dtype {str(value.dtype).replace('torch.', '')}"
                + (f", holding {' and '.join(bad)} of {array.size} values" if bad else ""))
    return _short(repr(value), 120)


def _short(text: str, limit: int = 600) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _doctest_repr(value: Any) -> str:
    """What the interpreter would print for ``value`` at a ``>>>`` prompt."""
    return "" if value is None else repr(value) + "\n"
