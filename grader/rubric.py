"""The assignment's grading spec (``rubrics/<name>.yaml``) as typed data.

Items are data, as in otter-grader: a name, points, tags, visibility and the hidden check
that decides them. Limits and tolerances live here too, so one file configures a
submission's grading; the CLI may override limits.
"""
from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

WRITTEN_TAG = "written"   # the pipeline's own tag of written questions; every other tag is the rubric's
INLINE_TAG = "inline"     # the pipeline's own tag of the master's test cells that name no tag
DEFAULT_CHECKS = "grader.checks.default"   # the checks module of a rubric that names none
VISIBILITIES = frozenset({"visible", "hidden", "after_due_date", "after_published"})
#: The languages a rubric may allow written answers in: those the written stage's screen
#: (grader/written/injection.py) reads, its patterns and word lists written for each.
ANSWER_LANGUAGES = {"en": "English", "de": "German", "fr": "French", "es": "Spanish", "pt": "Portuguese",
                    "ja": "Japanese", "zh": "Chinese"}


class RubricError(ValueError):
    """The rubric file itself is wrong: the grader cannot run."""


@dataclass(frozen=True)
class Item:
    name: str
    points: float
    tags: tuple[str, ...]
    title: str
    visibility: str = "visible"
    baseline: bool = False


@dataclass(frozen=True)
class Criterion:
    id: str
    points: float
    earns: str          # what earns the points
    misses: str = ""    # what does not


@dataclass(frozen=True)
class Question:
    id: str
    points: float
    criteria: tuple[Criterion, ...]
    misconceptions: tuple[str, ...] = ()
    grounding: tuple[str, ...] = ()     # answer variables whose values the question is about

    @property
    def item_name(self) -> str:
        return f"written_{self.id}"

    @property
    def title(self) -> str:
        return f"Written: {self.id}"


@dataclass(frozen=True)
class Agreement:
    """One thing the student's reported run and the grader's re-run of an answer variable (a
    JSON object) must agree on: ``fields`` equal, or with ``factor`` positive numbers within that
    factor of each other; only when the ``same`` fields (the sizes) are equal in both runs; with
    ``rows`` (a list field, such as the history lengths), element by element at the entries
    both runs have."""

    fields: tuple[str, ...]
    same: tuple[str, ...] = ()
    rows: str = ""
    factor: float = 0.0   # 0: exactly equal


@dataclass(frozen=True)
class Rerun:
    """The grader's run of one answer variable: its budget as the request labels it, and what
    must agree with the student's reported run."""

    budget: str
    agree: tuple[Agreement, ...] = ()


@dataclass(frozen=True)
class Prices:
    """USD per million tokens (the provider's list prices for the default model)."""

    input: float = 3.0
    output: float = 15.0
    cache_write: float = 3.75
    cache_read: float = 0.30
    batch_discount: float = 0.5


@dataclass(frozen=True)
class LLMSettings:
    """How written answers are graded; the CLI may override model, tokens and concurrency."""

    model: str = "claude-sonnet-4-5"
    max_tokens: int = 1500
    concurrency: int = 4
    max_retries: int = 4
    timeout_s: float = 120
    visibility: str = "after_published"
    # What the graded notebooks are, in the grader's instructions ("... answer from {notebook}").
    notebook: str = "a course notebook"
    # The course's language, and the others its answers may use: an answer or a quote in one of
    # them is screened and confirmed in it, never held for being in it (ISO 639-1 codes).
    language: str = "en"
    other_languages: tuple[str, ...] = ()
    prices: Prices = field(default_factory=Prices)

    @property
    def languages(self) -> tuple[str, ...]:
        """Every language answers may use, the course's first."""
        return (self.language, *(code for code in self.other_languages if code != self.language))


@dataclass(frozen=True)
class Limits:
    """Per-submission resource limits (see grader.sandbox for how they are enforced).

    The three time limits are CPU seconds, summed over the processes of the submission's code
    (a cell: the kernel and all it started; a probe case: its worker's; the notebook: the
    whole sandboxed run), so that a verdict does not depend on how busy the machine is. Code
    that sleeps or waits uses no CPU: a cell, a probe case or a whole run whose processes make
    no CPU progress while they could run is stopped as hung after ``idle_timeout_s`` wall-clock
    seconds (a starved one is not idle: ``cpu_time.IdleWatch``), and not graded again. Each
    time limit also has a wall-clock backstop ``wall_backstop_factor`` times as long, for code
    a busy machine starves. ``cpu_seconds`` is the kernel's own per-process limit (RLIMIT_CPU),
    the last resort.
    """

    memory_gib: float = 4
    cpu_seconds: int = 1800
    max_processes: int = 64
    file_size_mib: int = 256
    disk_mib: int = 2048
    cell_output_kib: int = 1024
    cell_timeout_s: float = 120
    notebook_timeout_s: float = 900
    probe_case_timeout_s: float = 60
    notebook_max_mib: float = 50
    wall_backstop_factor: float = 5
    idle_timeout_s: float = 30

    def backstop(self, cpu_limit: float) -> float:
        """Wall-clock seconds after which code under ``cpu_limit`` CPU seconds is stopped anyway."""
        return cpu_limit * self.wall_backstop_factor


@dataclass(frozen=True)
class Rubric:
    assignment: str
    checks: str
    tags: tuple[str, ...]           # the assignment's concern vocabulary, WRITTEN_TAG and INLINE_TAG included
    items: tuple[Item, ...]
    questions: tuple[Question, ...]
    limits: Limits
    tolerances: dict[str, float]
    answer_variables: tuple[str, ...]
    settings: dict[str, Any] = field(default_factory=dict)
    llm: LLMSettings = field(default_factory=LLMSettings)
    source_sha256: str = ""
    rerun: dict[str, Rerun] = field(default_factory=dict)   # answer variable -> the grader's run of it


    def item(self, name: str) -> Item:
        for item in self.items:
            if item.name == name:
                return item
        raise KeyError(name)

    @property
    def max_score(self) -> float:
        return sum(i.points for i in self.items) + sum(q.points for q in self.questions)

    def with_items(self, extra: list[Item], where: str) -> "Rubric":
        """A copy with ``extra`` items after its own (the master's test cells, ``where``):
        names unique and tags from the rubric's vocabulary."""
        names = [i.name for i in (*self.items, *extra)]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise RubricError(f"{where}: item names used twice (in the rubric and a test cell, or two test cells): "
                              f"{twice}")
        for item in extra:
            bad = set(item.tags) - set(self.tags)
            if bad or item.visibility not in VISIBILITIES:
                raise RubricError(f"{where}: test cell {item.name}: "
                                  + (f"unknown tags {sorted(bad)}" if bad else f"unknown visibility {item.visibility!r}"))
        return replace(self, items=(*self.items, *extra))

    def with_limits(self, **overrides: Any) -> "Rubric":
        """A copy whose limits take the given non-None overrides (from the CLI)."""
        given = {k: v for k, v in overrides.items() if v is not None}
        return replace(self, limits=_checked(replace(self.limits, **given), "the limits given"))


@dataclass(frozen=True)
class Field:
    """One key of the rubric's schema: what it holds (``doc``), and its shape: a mapping of
    known ``keys``; a list whose ``entries`` have one shape; a mapping of free keys whose
    ``values`` have one; or, with none of them, a value read as it is."""

    doc: str
    keys: dict[str, "Field"] | None = None
    entries: "Field | None" = None
    values: "Field | None" = None


def _fields_of(cls: type, docs: dict[str, str]) -> dict[str, Field]:
    return {name: Field(docs.get(name, name.replace("_", " "))) for name in cls.__dataclass_fields__}


#: The rubric's truth: every key a rubric file may hold, where, and what it is. ``load_rubric``
#: refuses any other key, naming where it is and the closest valid one.
RUBRIC_SCHEMA = Field("a rubric file", keys={
    "assignment": Field("the assignment's name (its folder under assignments/ and solutions/)"),
    "checks": Field("the module that decides the autograded items the rubric lists: a module of the grader's, "
                    "or one in the assignment root's checks/ folder; without it, only `notebook_runs` (the "
                    "master's test cells are items of their own, whatever this says)"),
    "tags": Field("the assignment's concerns: each tag, and what it names", values=Field("what the tag names")),
    "limits": Field("per-submission resource limits (each can be overridden on the CLI)",
                    keys=_fields_of(Limits, {})),
    "answer_variables": Field("the notebook variables the report cell exports and the written answers discuss",
                              entries=Field("a variable name")),
    "tolerances": Field("named numbers the checks module reads", values=Field("a number")),
    "settings": Field("assignment-specific settings the checks module reads, as it documents them"),
    "items": Field("the autograded items, in the order results list them", entries=Field("an item", keys={
        "name": Field("the item's id, as the checks module's verdicts name it"),
        "points": Field("its points"),
        "tags": Field("its concerns, from `tags`", entries=Field("a tag")),
        "title": Field("what students and TAs read"),
        "visibility": Field("Gradescope visibility: visible, hidden, after_due_date or after_published"),
        "baseline": Field("true when the untouched student notebook earns it through provided code alone"),
    })),
    "written": Field("the LLM rubric of the Question/Answer cells", keys={
        **{key: value for key, value in _fields_of(LLMSettings, {
            "notebook": "what the notebooks are, in the grader's instructions",
            "language": "the course's language, as an ISO 639-1 code (default `en`): answers may always use it",
            "other_languages": "further languages answers may use (codes, default none): an answer or quote in "
                               "one is screened and confirmed in it, never held for its language; one the screen "
                               "does not read is refused at load"}).items() if key != "prices"},
        "prices_per_mtok": Field("USD per million tokens, for the estimate and --llm-budget",
                                 keys=_fields_of(Prices, {})),
        "rerun": Field("per answer variable, the grader's run of it", values=Field("one variable", keys={
            "budget": Field("the grader's run in words, as the request labels it"),
            "agree": Field("what the student's reported run must agree on", entries=Field("a rule", keys={
                "fields": Field("fields equal in both runs", entries=Field("a field")),
                "same": Field("fields that must be equal for the rule to apply (the sizes)", entries=Field("a field")),
                "rows": Field("a list field: compare entry by entry where both runs have it"),
                "factor": Field("positive numbers within this factor, instead of equal"),
            })),
        })),
        "questions": Field("the written questions", entries=Field("a question", keys={
            "id": Field("the question's id, as its Question cell declares it"),
            "points": Field("its points: the sum of its criteria's"),
            "grounding": Field("answer variables whose values the request carries", entries=Field("a variable")),
            "misconceptions": Field("what the course warns about", entries=Field("a misconception")),
            "criteria": Field("what earns the points", entries=Field("a criterion", keys={
                "id": Field("the criterion's id"), "points": Field("its points"),
                "earns": Field("what earns them"), "misses": Field("what does not"),
            })),
        })),
    }),
})


def schema_problems(raw: Any, schema: Field = RUBRIC_SCHEMA, where: str = "") -> list[str]:
    """Every key of ``raw`` the schema has no place for there: where it is, the closest valid
    key, and where the key belongs when it is valid elsewhere (a misplaced key)."""
    problems = []
    if schema.keys is not None and isinstance(raw, dict):
        for key, value in raw.items():
            if key in schema.keys:
                problems += schema_problems(value, schema.keys[key], f"{where}.{key}" if where else str(key))
                continue
            said = f"unknown key `{key}` " + (f"in `{where}`" if where else "at the top level")
            close = difflib.get_close_matches(str(key), list(schema.keys), n=1, cutoff=0.6)
            elsewhere = [place for place in _PLACES.get(str(key), []) if place != where]
            problems.append(said + (f"; did you mean `{close[0]}`?" if close else "")
                            + (f"; `{key}` belongs in `{'` or `'.join(elsewhere)}`" if elsewhere else ""))
    elif schema.entries is not None and isinstance(raw, list):
        for index, entry in enumerate(raw):
            problems += schema_problems(entry, schema.entries, f"{where}[{index}]")
    elif schema.values is not None and isinstance(raw, dict):
        for key, value in raw.items():
            problems += schema_problems(value, schema.values, f"{where}.{key}")
    return problems


def _places(schema: Field, where: str = "") -> dict[str, list[str]]:
    """Each key the schema knows, and the places (``items[]``, ``written.rerun.*``) it belongs."""
    found: dict[str, list[str]] = {}
    for key, child in (schema.keys or {}).items():
        found.setdefault(key, []).append(where or "the top level")
        inner = f"{where}.{key}" if where else key
        for sub, places in _places(child, inner).items():
            found.setdefault(sub, []).extend(places)
    if schema.entries is not None:
        for sub, places in _places(schema.entries, f"{where}[]").items():
            found.setdefault(sub, []).extend(places)
    if schema.values is not None:
        for sub, places in _places(schema.values, f"{where}.*").items():
            found.setdefault(sub, []).extend(places)
    return found


_PLACES = _places(RUBRIC_SCHEMA)


def load_rubric(path: Path) -> Rubric:
    """Parse and validate a rubric file; raises RubricError with the offending entry."""
    raw_text = path.read_bytes()
    try:
        raw = yaml.safe_load(raw_text)
    except yaml.YAMLError as exc:
        raise RubricError(f"{path}: not valid YAML: {exc}") from exc
    except (RecursionError, MemoryError, ValueError) as exc:   # nesting or a number past the parser's limits
        raise RubricError(f"{path}: the YAML cannot be read ({type(exc).__name__}: {exc})") from exc
    if not isinstance(raw, dict):
        raise RubricError(f"{path}: expected a mapping at top level")
    problems = schema_problems(raw)
    if problems:
        raise RubricError(f"{path}: " + "; ".join(problems[:5]) + (f" (and {len(problems) - 5} more)"
                                                                   if len(problems) > 5 else ""))
    tags = raw.get("tags")
    if not isinstance(tags, dict) or not tags or WRITTEN_TAG in tags:
        raise RubricError(f"{path}: `tags` must map each of the assignment's tags to what it names "
                          f"(`{WRITTEN_TAG}` is the pipeline's own, for written questions)")
    items = tuple(_item(entry, path, set(tags)) for entry in raw.get("items", []))
    names = [i.name for i in items]
    if len(set(names)) != len(names):
        raise RubricError(f"{path}: duplicate item names")
    written = raw.get("written") or {}
    questions = tuple(_question(entry, path, set(raw.get("answer_variables") or ()))
                      for entry in written.get("questions", []))
    ids = [q.id for q in questions]
    if len(set(ids)) != len(ids):
        raise RubricError(f"{path}: duplicate written question ids")
    limits = _limits(raw.get("limits") or {}, path)
    return Rubric(
        assignment=str(raw["assignment"]),
        checks=str(raw.get("checks") or DEFAULT_CHECKS),
        tags=tuple(str(t) for t in tags) + (WRITTEN_TAG, INLINE_TAG),
        items=items,
        questions=questions,
        limits=limits,
        tolerances={k: float(v) for k, v in (raw.get("tolerances") or {}).items()},
        answer_variables=tuple(raw.get("answer_variables") or ()),
        settings=dict(raw.get("settings") or {}),
        llm=_llm_settings(written, path),
        source_sha256=hashlib.sha256(raw_text).hexdigest(),
        rerun=_reruns(written.get("rerun"), path, set(raw.get("answer_variables") or ())),
    )


def _limits(raw: dict[str, Any], path: Path) -> Limits:
    """The ``limits:`` entry."""
    return _checked(Limits(**raw), f"{path}: limits")


def _checked(limits: Limits, where: str) -> Limits:
    """``limits``, when a backstop is at least as long as the CPU limit it backs and the idle
    limit spans several of the watchdog's readings (a quarter of a second apart)."""
    for name, least in (("wall_backstop_factor", 1), ("idle_timeout_s", 1)):
        value = getattr(limits, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= least:
            raise RubricError(f"{where}: {name} must be a number of at least {least} (got {value!r})")
    return limits


def _item(entry: dict[str, Any], path: Path, vocabulary: set[str]) -> Item:
    try:
        item = Item(name=str(entry["name"]), points=float(entry["points"]),
                    tags=tuple(entry["tags"]), title=str(entry.get("title", entry["name"])),
                    visibility=str(entry.get("visibility", "visible")),
                    baseline=bool(entry.get("baseline", False)))
    except KeyError as exc:
        raise RubricError(f"{path}: item {entry!r} lacks {exc}") from exc
    bad = set(item.tags) - vocabulary
    if bad:
        raise RubricError(f"{path}: item {item.name}: unknown tags {sorted(bad)}")
    if item.visibility not in VISIBILITIES:
        raise RubricError(f"{path}: item {item.name}: unknown visibility {item.visibility!r}")
    return item


def _question(entry: dict[str, Any], path: Path, answer_variables: set[str]) -> Question:
    """One written question, checked: unique criterion ids, points that add up, known grounding."""
    try:
        criteria = tuple(Criterion(str(c["id"]), float(c["points"]), str(c["earns"]), str(c.get("misses", "")))
                         for c in entry.get("criteria", []))
        question = Question(str(entry["id"]), float(entry["points"]), criteria,
                            tuple(map(str, entry.get("misconceptions", []))),
                            tuple(map(str, entry.get("grounding", []))))
    except (KeyError, TypeError, ValueError) as exc:
        raise RubricError(f"{path}: written question {entry!r}: missing or bad {exc}") from exc
    where = f"{path}: written question {question.id}"
    ids = [c.id for c in criteria]
    if not criteria or len(set(ids)) != len(ids):
        raise RubricError(f"{where}: criteria need unique ids (got {ids})")
    if any(c.points <= 0 for c in criteria) or abs(sum(c.points for c in criteria) - question.points) > 1e-9:
        raise RubricError(f"{where}: criteria points {[c.points for c in criteria]} do not add up to "
                          f"{question.points:g}")
    unknown = set(question.grounding) - answer_variables
    if unknown:
        raise RubricError(f"{where}: grounding names {sorted(unknown)}, which are not answer_variables")
    return question


def _reruns(raw: Any, path: Path, answer_variables: set[str]) -> dict[str, Rerun]:
    """``written.rerun``: per answer variable, the budget of the grader's run and what must agree."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise RubricError(f"{path}: written rerun must map answer variables to their budget and agreements")
    found = {}
    for name, entry in raw.items():
        where = f"{path}: written rerun {name}"
        if name not in answer_variables:
            raise RubricError(f"{where}: not one of answer_variables")
        if not isinstance(entry, dict) or not isinstance(entry.get("budget"), str) or not entry["budget"].strip():
            raise RubricError(f"{where}: needs `budget`, the grader's run in words")
        agree = []
        for rule in entry.get("agree") or []:
            try:
                if not isinstance(rule["fields"], list) or not isinstance(rule.get("same", []), list):
                    raise TypeError("`fields` and `same` must be lists")
                agreement = Agreement(tuple(map(str, rule["fields"])), tuple(map(str, rule.get("same", ()))),
                                      str(rule.get("rows", "")), float(rule.get("factor", 0)))
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise RubricError(f"{where}: agreement {rule!r}: missing or bad {exc}") from exc
            if not agreement.fields or not (agreement.factor == 0 or agreement.factor >= 1):
                raise RubricError(f"{where}: agreement {rule!r} needs fields, and a factor of at least 1 if any")
            agree.append(agreement)
        found[str(name)] = Rerun(entry["budget"].strip(), tuple(agree))
    return found


def _llm_settings(written: dict[str, Any], path: Path) -> LLMSettings:
    known = {f for f in LLMSettings.__dataclass_fields__} - {"prices"}
    given = {k: v for k, v in written.items() if k in known}
    given.update(_languages(written, path))
    try:
        prices = Prices(**{k: float(v) for k, v in (written.get("prices_per_mtok") or {}).items()})
        settings = LLMSettings(**given, prices=prices)
    except (TypeError, ValueError) as exc:
        raise RubricError(f"{path}: written settings: {exc}") from exc
    if settings.visibility not in VISIBILITIES:
        raise RubricError(f"{path}: written visibility {settings.visibility!r} is not one of {sorted(VISIBILITIES)}")
    return settings


def _languages(written: dict[str, Any], path: Path) -> dict[str, Any]:
    """``written.language`` and ``written.other_languages``, checked against the languages the
    screen reads (a language it cannot read would pass its answers unread)."""
    found: dict[str, Any] = {}
    if "language" in written:
        found["language"] = written["language"]
    if "other_languages" in written:
        others = written["other_languages"]
        if not isinstance(others, list):
            raise RubricError(f"{path}: written other_languages must be a list of language codes (got {others!r})")
        found["other_languages"] = tuple(others)
    for code in (found.get("language", "en"), *found.get("other_languages", ())):
        if not isinstance(code, str) or code not in ANSWER_LANGUAGES:
            raise RubricError(f"{path}: written language {code!r} is not one the screen reads: "
                              + ", ".join(f"{c} ({name})" for c, name in ANSWER_LANGUAGES.items()))
    return found


def check_questions(rubric: Rubric, master_questions: set[str], path: Path) -> None:
    """Every Question cell of the master notebook has a rubric entry, and every entry a cell."""
    entries = {q.id for q in rubric.questions}
    if entries != master_questions:
        raise RubricError(f"{path}: written questions without a rubric entry: {sorted(master_questions - entries)}; "
                          f"rubric entries without a Question cell in the master: {sorted(entries - master_questions)}")
