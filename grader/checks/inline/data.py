"""Data from the student's run: a value the harness sent (``_as_data``) rebuilt here, by exact
type, never unpickled; anything else refused (:class:`NotData`)."""
from __future__ import annotations

from typing import Any

import numpy as np


class NotData(ValueError):
    """A value the student's run sent that is not data the grader reads."""


def from_data(value: Any, arrays: dict[str, np.ndarray], subclasses: list[str] | None = None) -> Any:
    """A value the harness's ``_as_data`` sent, rebuilt here: plain JSON as it is, tagged
    containers, arrays (with their dtype) and tensors (as torch tensors); an instance of a
    subclass of a built-in type as the built-in value, its class's name added to
    ``subclasses``. Raises NotData for a refused value, with the reason, or for anything
    malformed."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if type(value) is list:
        raise NotData("an untagged list")
    if type(value) is not dict or len(value) not in (1, 2):
        raise NotData("a malformed value")
    if "refused" in value:
        raise NotData(f"{value['refused']}, not a number, string, array, tensor or a list, tuple or dict of them")
    (tag, content), *rest = value.items()
    dtype = rest[0][1] if rest and rest[0][0] in ("dtype", "of") else None
    if tag == "sub" and isinstance(content, str) and rest:
        if subclasses is not None:
            subclasses.append(content.removeprefix("builtins."))
        return from_data(dtype, arrays, subclasses)
    if tag in ("list", "tuple", "set") and type(content) is list:
        items = [from_data(v, arrays, subclasses) for v in content]
        return {"list": list, "tuple": tuple, "set": set}[tag](items)
    if tag == "dict" and type(content) is list and all(type(p) is list and len(p) == 2 for p in content):
        return {_hashable(from_data(k, arrays, subclasses)): from_data(v, arrays, subclasses) for k, v in content}
    if tag == "float" and content in ("nan", "inf", "-inf"):
        return float(content)
    if tag == "scalar" and isinstance(dtype, str) and type(content) in (bool, int, float):
        return np.dtype(_known_dtype(dtype)).type(content)
    if tag == "np_dtype" and isinstance(content, str):
        return np.dtype(_known_dtype(content))
    if tag in ("array", "tensor", "torch_dtype"):
        return _array(tag, content, dtype, arrays)
    raise NotData("a malformed value")


def _hashable(key: Any) -> Any:
    if isinstance(key, (list, dict, set, np.ndarray)):
        raise NotData("a dict key that is not a number, string or tuple")
    return key


NUMPY_DTYPES = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64", "bfloat16"}


def _known_dtype(name: str) -> str:
    if name not in NUMPY_DTYPES or name == "bfloat16":
        raise NotData(f"an unknown dtype {name[:40]!r}")
    return name


def _array(tag: str, content: Any, dtype: Any, arrays: dict[str, np.ndarray]) -> Any:
    import torch
    if tag == "torch_dtype":
        if content not in NUMPY_DTYPES:
            raise NotData("an unknown torch dtype")
        return getattr(torch, content)
    if not isinstance(content, str) or content not in arrays or dtype not in NUMPY_DTYPES:
        raise NotData("an array that did not arrive")
    data = arrays[content]
    if tag == "array":
        return data.astype(_known_dtype(dtype)) if data.dtype != np.dtype(_known_dtype(dtype)) else data
    return torch.from_numpy(np.array(data, dtype=np.float64)).to(getattr(torch, dtype))
