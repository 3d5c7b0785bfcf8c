"""Where an assignment's files live in the project (see DESIGN.md's layout)."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import nbformat

from grader import cells
from grader.rubric import INLINE_TAG, Item, Rubric, RubricError, check_questions, load_rubric

PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Assignment:
    name: str
    root: Path = PROJECT_ROOT

    def __getstate__(self) -> dict[str, object]:
        """Name and root only: a process that receives an assignment (a pool worker, in the
        message that starts it) reads its files again. The notebooks it would carry otherwise
        fill the pipe, and starting a worker would wait until the worker had read them."""
        return {"name": self.name, "root": self.root}

    @property
    def master_path(self) -> Path:
        return self.root / "solutions" / self.name / f"{self.name}.ipynb"

    @property
    def template_path(self) -> Path:
        return self.root / "assignments" / self.name / f"{self.name}.ipynb"

    @property
    def rubric_path(self) -> Path:
        return self.root / "rubrics" / f"{self.name}.yaml"

    @cached_property
    def rubric(self) -> Rubric:
        rubric = load_rubric(self.rubric_path)
        check_questions(rubric, set(self.reference_answers), self.rubric_path)
        try:
            tests = cells.test_cells(self.master)
        except ValueError as exc:
            raise RubricError(f"{self.master_path}: {exc}") from None
        return rubric.with_items([Item(t.name, t.points, t.tags or (INLINE_TAG,), t.title, t.visibility)
                                  for t in tests], str(self.master_path))

    @cached_property
    def reference_answers(self) -> dict[str, cells.WrittenAnswer]:
        """The master notebook's own answers, by question id: the written rubric's reference."""
        found = {}
        for cell in self.master.cells:
            qid, parsed = cells.question_id(cell), cells.parse_written_answer(cell)
            if qid and parsed:
                found[qid] = parsed
        return found

    @cached_property
    def master(self) -> nbformat.NotebookNode:
        return nbformat.read(str(self.master_path), as_version=4)

    @cached_property
    def template(self) -> nbformat.NotebookNode:
        return nbformat.read(str(self.template_path), as_version=4)

    @cached_property
    def fingerprint(self) -> str:
        """Changes whenever the master or the template changes: what runs, and so part of the
        execution digest (``grader.digests``). The rubric is digested there as parsed: its
        limits for execution, all of it for evaluation."""
        digest = hashlib.sha256()
        for path in (self.master_path, self.template_path):
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        return digest.hexdigest()

    def check_files(self) -> str | None:
        """None when every file exists and both notebooks declare the same scaffold cells, else
        what is wrong (the grader cannot run)."""
        missing = [str(p) for p in (self.master_path, self.template_path, self.rubric_path)
                   if not p.is_file()]
        if missing:
            return f"assignment {self.name!r} is missing {', '.join(missing)}"
        try:
            declared = [(s.cell_id, s.symbols) for s in cells.scaffolds(self.master)]
            if not declared or declared != [(s.cell_id, s.symbols) for s in cells.scaffolds(self.template)]:
                return (f"assignment {self.name!r}: the student notebook's scaffold cells differ from the "
                        "master's (or there are none); regenerate it with `grader assign`")
        except ValueError as exc:
            return f"assignment {self.name!r}: {exc}"
        return None
