"""A run's output: each pipe read to its end on a thread of its own, the first bytes kept up to
a cap and the rest counted and dropped (the child never blocks on a full pipe, the grader's
memory stays bounded); the input written and closed."""
from __future__ import annotations

import os
import threading
from typing import IO


class _CappedReader(threading.Thread):
    """Read a pipe to its end, keeping the first ``cap`` bytes and counting the rest."""

    def __init__(self, pipe: IO[bytes], cap: int) -> None:
        super().__init__(daemon=True)
        self._pipe, self.cap = pipe, cap
        self._chunks: list[bytes] = []
        self.kept = 0
        self.dropped = 0
        self.start()

    def run(self) -> None:
        fd = self._pipe.fileno()
        try:
            while chunk := os.read(fd, 1 << 16):
                keep = chunk[: max(0, self.cap - self.kept)]
                if keep:
                    self._chunks.append(keep)
                    self.kept += len(keep)
                self.dropped += len(chunk) - len(keep)
        except OSError:
            pass
        finally:
            self._pipe.close()

    def data(self) -> bytes:
        return b"".join(self._chunks)

    def text(self) -> str:
        text = self.data().decode("utf-8", errors="replace")
        if self.dropped:
            text += f"\n[... truncated {self.dropped} bytes]\n"
        return text


def _feed(pipe: IO[bytes], data: bytes) -> None:
    """Write ``data`` to the command's stdin, then close it (the command may not read)."""
    try:
        pipe.write(data)
    except OSError:
        pass
    finally:
        try:
            pipe.close()
        except OSError:
            pass
