"""grader/report/terminal.py's sanitizer: what a student wrote reaches a terminal as text only.

(check.py's copy of it is compared in tests/test_assign.py; the commands that print submission
text run on a pseudo-terminal in tests/test_check.py.)
"""
from __future__ import annotations

import io

import pytest

from grader.report.terminal import plain, say

from conftest import HONEST_TEXT, TERMINAL_ATTACKS


@pytest.mark.parametrize("hostile, shown", TERMINAL_ATTACKS.values(), ids=TERMINAL_ATTACKS.keys())
def test_plain_removes_what_a_terminal_acts_on(hostile, shown):
    assert plain(hostile) == shown


@pytest.mark.parametrize("text", HONEST_TEXT)
def test_plain_keeps_honest_text(text):
    assert plain(text) == text


def test_say_prints_plain_text_to_the_stream_given():
    stream = io.StringIO()
    say("\x1b]0;pwned\x07grader: bad\tnotebook\r", stream)
    say("no newline\x9b", stream, end="")
    assert stream.getvalue() == "grader: bad\tnotebook\nno newline"


def test_say_writes_to_standard_output_at_the_call(capsys):
    say("\x1b[2Jshown")
    assert capsys.readouterr().out == "shown\n"
