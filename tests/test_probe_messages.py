"""What the probe's trusted side accepts from a worker's message (grader/probe.py).

A worker runs student code, so its message may be anything: truncated, oversized, pickled
objects instead of arrays, names that do not belong. These build messages by hand in the
harness's format and check what comes out.
"""
from __future__ import annotations

import io
import json
import pickle
import struct

import numpy as np

from grader.probe import ProbeCase, Segments, _case_output, parse_message


def message(arrays: dict[str, bytes], details: dict, ok: bool = True) -> bytes:
    parts = [b"\x00" if ok else b"\x01", struct.pack(">I", len(arrays))]
    for name, blob in arrays.items():
        parts += [struct.pack(">H", len(name)), name.encode(), struct.pack(">Q", len(blob)), blob]
    text = json.dumps(details).encode()
    return b"".join(parts + [struct.pack(">Q", len(text)), text])


def npy(value: np.ndarray, allow_pickle: bool = False) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, value, allow_pickle=allow_pickle)
    return buffer.getvalue()


def test_a_well_formed_message_is_read() -> None:
    read = parse_message(message({"y": npy(np.ones((1, 2, 3)))}, {"info": {"a": 1}}))
    assert read is not None and read.ok and read.details == {"info": {"a": 1}}
    assert read.arrays["y"].shape == (1, 2, 3)


def test_truncated_or_padded_messages_are_refused() -> None:
    data = message({"y": npy(np.ones(4))}, {"info": {}})
    for broken in (data[:1], data[:10], data[:-1], data + b"x", b"", b"\x00" + b"\xff" * 8):
        assert parse_message(broken) is None


def test_pickled_and_non_float_arrays_are_dropped() -> None:
    evil = npy(np.array([object()], dtype=object), allow_pickle=True)
    read = parse_message(message({"y": evil, "n": npy(np.arange(3)), "junk": pickle.dumps([1])}, {}))
    assert read is not None and read.arrays == {}


def test_segments_are_joined_and_the_relayed_states_measured() -> None:
    case = ProbeCase("steps_x", "steps", {}, {}, ("y",), Segments("x", ((0, 2), (2, 5)), unit="tokens",
                                                          state="a tuple of tensors (S, z)"))
    state = {"state.0": npy(np.zeros((1, 2, 3, 3))), "state.1": npy(np.zeros((1, 2, 3)))}
    first = message({"y": npy(np.zeros((1, 2, 6))), **state}, {"info": {}})
    second = message({"y": npy(np.ones((1, 3, 6))), **state}, {"info": {}})
    ok = {"status": "ok"}
    out = _case_output(case, [(ok, first), (ok, second)])
    assert out is not None and out.status == "ok"
    assert out.arrays["y"].shape == (1, 5, 6) and out.arrays["y"][0, 2:].min() == 1
    assert out.info["states"] == [[[1, 2, 3, 3], [1, 2, 3]]] * 2
    assert [[a.shape for a in state] for state in out.states] == [[(1, 2, 3, 3), (1, 2, 3)]] * 2
    # The supervisor died before the second segment: not finished, so the probe reruns it.
    assert _case_output(case, [(ok, first)]) is None


def test_a_segment_without_a_state_to_hand_on_ends_the_case() -> None:
    case = ProbeCase("steps_x", "steps", {}, {}, ("y",), Segments("x", ((0, 2), (2, 5)), unit="tokens",
                                                          state="a tuple of tensors (S, z)"))
    first = message({"y": npy(np.zeros((1, 2, 6)))}, {"info": {}})
    out = _case_output(case, [({"status": "ok"}, first)])
    assert out is not None and out.status == "error"
    assert "tuple of tensors (S, z) (tokens 0 to 1)" in (out.error or "")


def test_a_worker_error_names_the_segment() -> None:
    case = ProbeCase("steps_x", "steps", {}, {}, ("y",), Segments("x", ((0, 2), (2, 5)), unit="tokens",
                                                          state="a tuple of tensors (S, z)"))
    failed = message({}, {"error": "ValueError: boom"}, ok=False)
    out = _case_output(case, [({"status": "ok"}, message({"y": npy(np.zeros((1, 2, 6))),
                                                          "state.0": npy(np.zeros(1))}, {})),
                              ({"status": "ok"}, failed)])
    assert out is not None and out.status == "error" and out.error == "ValueError: boom (tokens 2 to 4)"
    timed_out = _case_output(case, [({"status": "timeout", "error": "stopped after 10 s"}, b"")])
    assert timed_out is not None and timed_out.status == "timeout"
