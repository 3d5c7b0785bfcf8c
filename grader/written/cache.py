"""Drafts on disk, keyed by everything that decides them: regrading an unchanged answer
costs no request."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any


def cache_key(model: str, rubric_sha256: str, prompt_version: str, question_id: str, answer: str,
              grounding: dict[str, Any]) -> str:
    parts = {"model": model, "rubric": rubric_sha256, "prompt": prompt_version, "question": question_id,
             "answer": hashlib.sha256(answer.encode()).hexdigest(), "grounding": grounding}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


class DraftCache:
    """One JSON file per key under ``folder``; written atomically, unreadable entries ignored."""

    def __init__(self, folder: Path):
        self.folder = folder

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.folder / f"{key}.json").read_text())
        except (OSError, ValueError):
            return None

    def put(self, key: str, record: dict[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        temporary = self.folder / f"{key}.json.tmp"
        temporary.write_text(json.dumps(record))
        os.replace(temporary, self.folder / f"{key}.json")
