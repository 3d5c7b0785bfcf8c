"""The review queue for a class: one page per question and per errored item, answers that say
the same thing grouped (grader/report/grouping.py), and a class page whose size does not grow
with the queue. Measured on a synthetic class of 200 built from recorded results with noise (no
grading here), in Chromium too: every page's bytes, height and render time are printed."""
from __future__ import annotations

import html
import random
import re
import time
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pytest
import yaml
from playwright.sync_api import sync_playwright

from grader.cli import main
from grader.report.grouping import group_answers
from grader.report.pages import QUEUE_FOLDER, ROWS_PER_PAGE, SUMMARY_PAGE, write_pages
from grader.report.results import read_results, write_result
from grader.written import WRITTEN_INPUTS

from test_pages import AXE, CHROMIUM, CHROMIUM_FLAGS, serious_violations
from test_reports import recorded

# Families of answers: each family says one thing; its variants are what a class writes.
FAMILIES = [
    "Full attention keeps every key and value in its cache, so one decode step costs more as the history grows, "
    "while the linear step updates a fixed d_k x d_v state.",
    "The crossover is near T = 1024 on my machine: below it the cached full-attention step is cheaper, above it the "
    "linear step wins.",
    "Synchronizing before and after the timed call matters because the device runs asynchronously: without it the "
    "timer measures the launch, not the computation.",
    "There is no crossover in the measured range: the linear step was slower at every history length I tried, "
    "probably because of the Python overhead of the step.",
    "We compare one-token decode paths because that is what generation pays per token; a training pass processes "
    "the whole sequence at once and measures something else.",
    "The KV cache grows linearly with the history, 16 KB per token here, while the recurrent state stays at 66 KB "
    "whatever the length.",
]


def variants(text: str, rng: random.Random) -> list[tuple[str, str]]:
    """(level, variant) of one family's answer: what grouping must put with it."""
    words = text.split()
    swapped = list(words)
    i = rng.randrange(3, len(words) - 3)
    swapped[i] = "really"
    reordered = ". ".join(reversed(text.rstrip(".").split(": "))) + "."
    return [("exact", text), ("exact", "  " + text.upper().replace(",", " ,") + " "), ("near", " ".join(swapped)),
            ("near", text + " That is all."), ("similar", reordered)]


def test_grouping_is_measured_both_ways():
    """Every variant lands with its family (recall, by level), and no group mixes families
    (precision), with the figures printed."""
    rng = random.Random(5)
    answers, family_of, level_of = {}, {}, {}
    for f, text in enumerate(FAMILIES):
        for v, (level, variant) in enumerate(variants(text, rng)):
            key = f"s{f}-{v}"
            answers[key], family_of[key], level_of[key] = variant, f, level
    groups = group_answers(dict(sorted(answers.items(), key=lambda kv: rng.random())))
    mixed = [g.members for g in groups if len({family_of[m] for m in g.members}) > 1]
    home = {}
    for g in groups:
        leader_family = family_of[g.members[0]]
        for m in g.members:
            home[m] = family_of[m] == leader_family and len([x for x in groups if family_of[x.members[0]] == family_of[m]]) == 1
    recall = {level: sum(home[k] for k in answers if level_of[k] == level) / sum(level_of[k] == level for k in answers)
              for level in ("exact", "near", "similar")}
    print(f"\n{len(answers)} answers in {len(FAMILIES)} families -> {len(groups)} groups; groups mixing families: "
          f"{len(mixed)}; grouped with their family: " + ", ".join(f"{k} {v:.0%}" for k, v in recall.items()))
    assert not mixed and recall["exact"] == recall["near"] == 1.0 and recall["similar"] >= 0.8
    assert len(groups) == len(FAMILIES)


CLASS = 200
FAILURES = ["float64: max-abs error {e} at position {p}", "step decays S but not z",
            "forward raised NotImplementedError: implement the parallel form, at line {p}"]


@pytest.fixture(scope="module")
def big_class(tmp_path_factory, assignment) -> Path:
    """200 recorded results with noise: a few failed checks each, every written answer pending
    with a draft (confidence spread), some flagged, answers from the families above."""
    out = tmp_path_factory.mktemp("class200")
    rng = random.Random(11)
    questions = assignment.rubric.questions
    checks = [i.name for i in assignment.rubric.items]
    for n in range(CLASS):
        sid = f"student{n:03d}"
        failed = {name: rng.choice(FAILURES).format(e=round(rng.random(), 3), p=rng.randrange(64))
                  for name in rng.sample(checks, rng.randrange(0, 4))}
        written, answers = {}, {}
        for q in questions:
            family = FAMILIES[rng.randrange(len(FAMILIES))]
            answer = rng.choice(variants(family, rng))[1] if rng.random() > 0.05 else f"My own answer {n} to {q.id}."
            answers[q.id] = answer
            flags = ["addresses the grader"] if rng.random() < 0.02 else []
            written[q.item_name] = {"score": 0.0, "status": "pending_review", "output": "draft", "details": {
                "model": "m", "confidence": round(rng.uniform(0.4, 1.0), 2), "draft_score": float(q.points),
                "criteria": [], "feedback": "", "flags": flags, "needs_review": False}}
        result = recorded(assignment, sid, failed, written)
        result.artifacts = {WRITTEN_INPUTS: __import__("json").dumps({"answers": answers}).encode()}
        write_result(out, result)
    write_pages(out, read_results(out))
    return out


def test_a_class_of_200_has_a_bounded_class_page_and_paginated_queue_pages(big_class, assignment):
    summary = (big_class / SUMMARY_PAGE).read_bytes()
    pages = sorted((big_class / QUEUE_FOLDER).glob("*.html"))
    fixed, per_student = 100_000, 3_000
    print(f"\nsummary.html: {len(summary):,} bytes for {CLASS} students ({len(summary) / CLASS:,.0f} a student); "
          f"{len(pages)} queue pages, largest {max(p.stat().st_size for p in pages):,} bytes")
    assert len(summary) <= fixed + per_student * CLASS
    assert b"queue-group" not in summary and summary.count(b'href="queue/') >= len(assignment.rubric.questions)
    for path in pages:
        rows = len(re.findall(r"<tr><td><span class=\"meta\">", path.read_text()))
        assert 1 <= rows <= ROWS_PER_PAGE, path.name


def test_a_ta_clears_a_question_for_200_in_a_few_pastes(big_class, assignment, tmp_path):
    """Accept the confident drafts with one block, then one block per remaining group: every
    member's decision is recorded with its reviewer and time, and the question leaves the queue."""
    import shutil
    out = tmp_path / "class"
    shutil.copytree(big_class, out)
    question = assignment.rubric.questions[0]
    first = (out / QUEUE_FOLDER / f"{question.item_name}-1.html").read_text()
    accept = html.unescape(re.search(r"confidence &ge; 0\.8: \d+ drafts?</summary><pre class=\"block accept\">(.*?)</pre>", first, re.S)[1])
    pastes = [accept]
    accepted = set(yaml.safe_load(accept))
    page_files = sorted((out / QUEUE_FOLDER).glob(f"{question.item_name}-*.html"))
    typed = 0
    for path in page_files:
        for block in re.findall(r'<pre class="block">(.*?)</pre>', path.read_text(), re.S):
            block = html.unescape(block)
            if "score: null" in block:                    # a flagged answer's own lines: the TA types its score
                block, typed = re.sub(r"score: null[^\n]*", "score: 1", block), typed + 1
            if set(yaml.safe_load(block)) - accepted:     # a group with someone the accept block left out
                pastes.append(block)
    text = "\n".join(pastes).replace('reviewer: ""', "reviewer: jdoe")
    # a member decided by two pasted blocks is one override: keep the first, as a TA would
    kept, seen = [], set()
    for entry in re.split(r"\n(?=\S)", text):
        sid = entry.split(":", 1)[0]
        if sid not in seen:
            seen.add(sid)
            kept.append(entry)
    (out / "overrides.yaml").write_text("\n".join(kept) + "\n")
    with redirect_stdout(StringIO()):
        assert main(["report", str(out)]) == 0
    waiting = {r.submission_id for r in read_results(out) for i in r.items
               if i.name == question.item_name and i.override is None}
    print(f"\n{CLASS} answers to {question.id} cleared in {len(pastes)} pastes ({len(accepted)} confident drafts "
          f"accepted with one block, {typed} flagged answers decided alone, their scores typed)")
    assert not waiting and len(pastes) <= 25
    decided = next(i for r in read_results(out) for i in r.items if i.name == question.item_name)
    assert decided.override["reviewer"] == "jdoe" and re.fullmatch(r"\d{4}-\d\d-\d\dT.*", decided.override["time"])
    assert not (out / QUEUE_FOLDER / f"{question.item_name}-1.html").exists()


def test_the_class_pages_in_chromium(big_class):
    """One page of each kind, the class page and a question's queue page (the queue pages share
    one template, and every one's rows are bounded above): bytes, height and render time in
    Chromium (printed); heights bounded, and axe finds nothing serious."""
    assert CHROMIUM.is_file() and AXE.is_file()
    pages = [big_class / SUMMARY_PAGE, sorted((big_class / QUEUE_FOLDER).glob("*.html"))[0]]
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            problems, figures = [], []
            for path in pages:
                start = time.perf_counter()
                page.goto(path.as_uri())
                took = time.perf_counter() - start
                height = page.evaluate("document.documentElement.scrollHeight")
                members = page.locator("#queue li").count()
                figures.append((path.name, path.stat().st_size, height, took, members))
                problems += serious_violations(page)
        finally:
            browser.close()
    print("\n" + "\n".join(f"{name}: {size:,} bytes, {height:,} px, {took * 1000:.0f} ms" + (
        f" ({members} members)" if members else "") for name, size, height, took, members in figures))
    # the class page: a fixed part and one row a student; a queue page: a fixed part and a line a member
    assert figures[0][2] <= 4_000 + 80 * CLASS, figures[0]
    assert all(height <= 2_000 + 40 * members for _, _, height, _, members in figures[1:]), figures
    assert problems == []
