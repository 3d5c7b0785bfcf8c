"""The review queue's blocks say only what its page shows (issue 40): a pasted block decides no
answer whose words the page did not show, and no flagged or held answer at the draft's score.

One question of a recorded class (no grading here): 22 honest answers that say the same thing in
one row, three wrong answers written to join them (a symbol flipped, two words changed, the
good answer's words rearranged into a false claim), one the detector flagged (invisible
characters) and one held because its evidence is in another language. Each test reads the queue
page and the class page before and after the TA's pastes, and prints what was caught and what
was left alone."""
from __future__ import annotations

import html
import json
import re
import shutil
from contextlib import redirect_stderr, redirect_stdout
from io import StringIO
from pathlib import Path

import pytest
import yaml

from grader.cli import main
from grader.report.pages import QUEUE_FOLDER, SUMMARY_PAGE, queue_page_name, write_pages
from grader.report.results import read_results, write_result
from grader.written import WRITTEN_INPUTS
from grader.written.injection import INVISIBLE, scan

from test_reports import recorded

GOOD = ("The crossover is near T = 1024 on my machine: when T < 1024 the cached full-attention step is cheaper, "
        "and when T > 1024 the linear step wins.")
HONEST = [GOOD, GOOD.upper(), "  " + GOOD.replace(",", " ,") + "  ", GOOD.lower().replace(":", ";"),
          GOOD.replace("machine:", "machine -"), GOOD.rstrip(".") + "!"]
# Wrong answers written to pass for the good one, and the words that make them wrong (the good
# answer's, then theirs).
WRONG = {
    "symbol": (GOOD.replace("T < 1024", "T > 1024", 1), "<", ">"),
    "two_words": (GOOD.replace("the cached full-attention step is", "the linear step is"), "full-attention", "linear"),
    "rearranged": (GOOD.replace("the cached full-attention step is cheaper", "the linear step is cheaper")
                   .replace("the linear step wins", "the cached full-attention step wins"), "full-attention", "linear"),
}
FLAGGED = "flagged_hidden"
HIDDEN = "The cross\u200bover is near T = 1024 on my machine\u200d: when T < 1024 the cached full-attention step is " \
         "cheaper, and when T > 1024 the linear step wins."
HELD = "held_language"
GERMAN = ("Der Übergang liegt auf meinem Rechner bei T = 1024: darunter ist der Schritt mit vollem Cache billiger, "
          "darüber gewinnt der lineare Schritt.")
LANGUAGE = "the quote 'Der Übergang liegt auf meinem Rechner bei T = 1024' is not in English, the course's language"
SURE = "sure_other_words"
OTHER = ("Below about a thousand tokens of history full attention with its cache wins; beyond that the recurrent "
         "linear form is faster per decoded token.")


def draft(points: float, confidence: float, flags: list[str] | None = None, criteria: list | None = None) -> dict:
    """A pending written item as the written stage leaves it: the model's draft of ``points``."""
    return {"score": 0.0, "status": "pending_review", "output": "draft", "details": {
        "model": "m", "confidence": confidence, "draft_score": points, "criteria": criteria or [], "feedback": "",
        "flags": flags or [], "needs_review": False}}


@pytest.fixture(scope="module")
def graded(tmp_path_factory, assignment) -> Path:
    """The class: every answer pending with a draft of full points (the model was fooled by the
    wrong ones too), below every accept block's confidence but for the held and the sure one."""
    out = tmp_path_factory.mktemp("blocks")
    question = assignment.rubric.questions[0]
    criterion = question.criteria[0]
    language_wait = [{"id": criterion.id, "points": 0.0, "suggested": criterion.points,
                      "max_points": criterion.points, "rationale": "states it",
                      "evidence": ["Der Übergang liegt auf meinem Rechner bei T = 1024"], "waits": LANGUAGE}]
    answers = {f"good{n:02d}": (HONEST[n % len(HONEST)], draft(question.points, 0.4 + n / 100)) for n in range(22)}
    answers |= {f"wrong_{name}": (text, draft(question.points, 0.5)) for name, (text, _, _) in WRONG.items()}
    answers |= {FLAGGED: (HIDDEN, draft(question.points, 0.9, scan(HIDDEN, {}))),
                HELD: (GERMAN, draft(question.points, 0.95, criteria=language_wait)),
                SURE: (OTHER, draft(question.points, 0.95))}
    for sid, (text, written) in answers.items():
        result = recorded(assignment, sid, written={question.item_name: written})
        result.artifacts = {WRITTEN_INPUTS: json.dumps({"answers": {question.id: text}}).encode()}
        write_result(out, result)
    write_pages(out, read_results(out))
    return out


@pytest.fixture
def folder(graded, tmp_path) -> Path:
    out = tmp_path / "class"
    shutil.copytree(graded, out)
    return out


def queue_page(out: Path, assignment) -> str:
    return (out / QUEUE_FOLDER / queue_page_name(assignment.rubric.questions[0].item_name, 1)).read_text()


def rows(page: str) -> list[dict]:
    """Each row of a queue page: its members' lines (id -> the line's HTML, in order), the answer
    it shows, its group block (YAML) and the ids it names, and the members' own blocks (id -> YAML)."""
    found = []
    for row in re.findall(r'<tr><td><span class="meta">.*?</td></tr>', page, re.S):
        lines = {re.search(r'href="\.\./([^/]+)/review\.html', li)[1]: li
                 for li in re.findall(r"<li>(.*?)</li>", row, re.S)}
        group = re.search(r'<summary>lines for \d+ members?</summary><pre class="block">(.*?)</pre>', row, re.S)
        block = html.unescape(group[1]) if group else ""
        found.append({"lines": lines, "shown": html.unescape(re.search(r"<td><pre>(.*?)</pre></td>", row, re.S)[1]),
                      "block_text": block, "block": set(yaml.safe_load(block)) if block else set(),
                      "own": {sid: html.unescape(block) for sid, block in re.findall(
                          r'<summary>(\S+) alone: type its score</summary><pre class="block">(.*?)</pre>', row, re.S)}})
    return found


def accept_blocks(page: str) -> dict[str, set[str]]:
    return {step: set(yaml.safe_load(html.unescape(block))) for step, block in re.findall(
        r'confidence &ge; (0\.\d): \d+ drafts?</summary><pre class="block accept">(.*?)</pre>', page, re.S)}


def changes_shown(row: dict, sid: str) -> tuple[str, str] | None:
    """The words struck and the words marked inserted beside ``sid`` in its row (a member with the
    same words as the one above shares that one's), or None when none are shown."""
    ids = list(row["lines"])
    for other in reversed(ids[:ids.index(sid) + 1]):
        line = row["lines"][other]
        if '<p class="changes">' in line:
            return (" ".join(html.unescape(t) for t in re.findall(r"<del>(.*?)</del>", line, re.S)),
                    " ".join(html.unescape(t) for t in re.findall(r"<ins>(.*?)</ins>", line, re.S)))
        if "the same words as above" not in line:
            return None
    return None


def paste(out: Path, text: str) -> tuple[int, str]:
    """``text`` as overrides.yaml with a reviewer, then ``grader report``: its exit status and what it said."""
    (out / "overrides.yaml").write_text(text.replace('reviewer: ""', "reviewer: jdoe") + "\n")
    with redirect_stdout(StringIO()) as said, redirect_stderr(said):
        status = main(["report", str(out)])
    return status, said.getvalue()


def summary_queue_row(out: Path) -> list[str]:
    """The class page's queue row of the question, its numbers: waiting, groups, decided alone, pages."""
    summary = (out / SUMMARY_PAGE).read_text()
    row = re.search(r'<tr><td><a href="queue/written_ex1_crossover-1\.html">(.*?)</tr>', summary, re.S)
    return re.findall(r'<td class="num">(\d+)</td>', row[1]) if row else []


def decided(out: Path, assignment) -> dict[str, float]:
    name = assignment.rubric.questions[0].item_name
    return {r.submission_id: i.score for r in read_results(out) for i in r.items if i.name == name and i.override}


def test_a_wrong_answer_near_a_good_one_is_decided_only_on_its_own_words(folder, assignment):
    """(a) A symbol flipped, two words changed, the words rearranged into a false claim: each is in
    no block beside the good answers unless its row marks the words that differ; the honest
    answers still share one row, no changes to read, and clear with one paste."""
    page = queue_page(folder, assignment)
    found = rows(page)
    good_row = next(r for r in found if "good00" in r["lines"])
    caught = {}
    for name, (text, theirs_was, theirs) in WRONG.items():
        sid = f"wrong_{name}"
        assert all(sid not in block for block in accept_blocks(page).values())
        row = next(r for r in found if sid in r["lines"])
        if sid in row["block"] and len(row["block"]) > 1 and row["shown"] != text:
            shown = changes_shown(row, sid)
            assert shown, f"{sid} is in a block beside {len(row['block']) - 1} others with none of its words shown"
            struck, inserted = shown
            assert theirs_was in struck and theirs in inserted, (sid, shown)
            caught[name] = f"marked in the good row: struck {struck!r}, inserted {inserted!r}"
        else:
            caught[name] = "in a row of its own, its words shown"
    honest = [sid for sid in good_row["lines"] if sid.startswith("good")]
    to_read = [sid for sid in honest if changes_shown(good_row, sid)]
    print("\ncaught: " + "; ".join(f"{k}: {v}" for k, v in caught.items()))
    print(f"left alone: {len(honest)} of 22 honest answers in one row, {len(to_read)} with changes to read")
    assert len(honest) == 22 and not to_read and good_row["shown"] in HONEST

    # The TA reads the marked changes, deletes those members' lines and pastes the rest: one paste.
    marked = {sid for sid in good_row["lines"] if changes_shown(good_row, sid)}
    kept = "\n".join(entry for entry in re.split(r"\n(?=\S)", good_row["block_text"])
                     if yaml.safe_load(entry).keys().isdisjoint(marked))
    assert paste(folder, kept)[0] == 0
    scores = decided(folder, assignment)
    print(f"one paste: {sum(s.startswith('good') for s in scores)} honest answers at full points; "
          f"wrong answers decided: {sorted(s for s in scores if s.startswith('wrong'))}")
    assert {sid for sid in scores if sid.startswith("good")} == set(honest)
    assert all(scores[sid] == assignment.rubric.questions[0].points for sid in honest)
    assert not any(sid.startswith("wrong") for sid in scores)
    after = rows(queue_page(folder, assignment))
    assert all(any(f"wrong_{name}" in r["lines"] for r in after) for name in WRONG)
    assert not any(sid.startswith("good") for r in after for sid in r["lines"])
    assert summary_queue_row(folder)[0] == str(len(WRONG) + 3)   # the wrong, the flagged, the held, the sure


def test_a_flagged_answer_is_in_no_prefilled_block_and_its_line_says_why(folder, assignment):
    """(b) An answer with invisible characters reads as the good one: it is listed in the good row,
    flagged and why, in no group or accept block; its own lines leave the score to the TA, and
    pasting them untyped applies nothing."""
    page = queue_page(folder, assignment)
    row = next(r for r in rows(page) if FLAGGED in r["lines"])
    said = html.unescape(re.search(r'<span class="flag">(.*?)</span>', row["lines"][FLAGGED], re.S)[1])
    assert FLAGGED not in row["block"] and all(FLAGGED not in b for b in accept_blocks(page).values())
    assert "flagged" in said and INVISIBLE in said
    own = yaml.safe_load(row["own"][FLAGGED])
    item = assignment.rubric.questions[0].item_name
    assert own[FLAGGED][item]["score"] is None
    print(f"\ncaught: {FLAGGED} listed in a row of {len(row['lines'])}, its line saying {said!r}, "
          f"in none of the {1 + len(accept_blocks(page))} blocks that decide several")
    print(f"left alone: the {len(row['block'])} unflagged members of its row stay in its block")
    assert len(row["block"]) >= 22 and summary_queue_row(folder)[2] == "2"   # the flagged and the held decide alone

    status, said = paste(folder, row["own"][FLAGGED])
    assert status == 2 and f"{FLAGGED}/{item}: score null is not a number" in said and not decided(folder, assignment)
    assert paste(folder, row["own"][FLAGGED].replace("score: null", "score: 0"))[0] == 0
    assert decided(folder, assignment) == {FLAGGED: 0.0}
    assert not any(FLAGGED in r["lines"] for r in rows(queue_page(folder, assignment)))
    assert summary_queue_row(folder)[2] == "1"


def test_a_held_draft_is_in_no_accept_block(folder, assignment):
    """(c) A confident draft held because its evidence is in another language is in no accept
    block; its line says why and its own lines leave the score to the TA. A confident draft held
    for nothing but review is accepted with the 0.9 block."""
    page = queue_page(folder, assignment)
    accepts = accept_blocks(page)
    row = next(r for r in rows(page) if HELD in r["lines"])
    line = html.unescape(row["lines"][HELD])
    assert all(HELD not in block for block in accepts.values()) and HELD not in row["block"]
    assert "decided alone" in line and "is not in English, the course's language" in line
    assert yaml.safe_load(row["own"][HELD])[HELD][assignment.rubric.questions[0].item_name]["score"] is None
    print(f"\ncaught: {HELD} (confidence 0.95) in none of the accept blocks "
          + ", ".join(f"{step}: {len(ids)} drafts" for step, ids in accepts.items()))
    print(f"left alone: {SURE} (confidence 0.95, nothing held) is in the 0.9 block")
    assert accepts["0.9"] == {SURE}

    accept = html.unescape(re.search(r'confidence &ge; 0\.9: \d+ drafts?</summary><pre class="block accept">(.*?)</pre>',
                                     page, re.S)[1])
    assert paste(folder, accept)[0] == 0 and decided(folder, assignment) == {SURE: assignment.rubric.questions[0].points}
    after = queue_page(folder, assignment)
    assert HELD in after and all(HELD not in block for block in accept_blocks(after).values())
    assert summary_queue_row(folder)[0] == str(22 + len(WRONG) + 2)
