"""executed.html, the executed notebook for TAs: rendered in process from a notebook whose
outputs carry script, frames and remote files, checked as text and in a real Chromium (no
script runs, no request leaves the page, the ordinary outputs are shown), linked from
review.html and never from report.html, and no page, with a reason, for a notebook that
cannot be one."""
from __future__ import annotations

import base64
import json
import os
import struct
import zlib
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output, new_raw_cell
from nbconvert.preprocessors.sanitize import SanitizeHTML
from playwright.sync_api import sync_playwright

from grader.pipeline import EXECUTED_NOTEBOOK
from grader.report import executed
from grader.report.executed import EXECUTED_PAGE, first_loader, render_executed, write_executed_page
from grader.report.pages import REPORT_PAGE, REVIEW_PAGE, write_pages
from grader.report.results import read_results, write_result
from grader.score import GradeResult, ItemResult

from test_pages import CHROMIUM, CHROMIUM_FLAGS

TRAP = "http://127.0.0.1:9"   # nothing listens there; a request to it is counted, then aborted


def png(width: int, height: int) -> str:
    """A real RGB PNG of the given size (grey), base64 as a notebook stores it."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    rows = b"".join(b"\x00" + b"\x80\x80\x80" * width for _ in range(height))
    data = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
    return base64.b64encode(data).decode()


def hostile_notebook() -> nbformat.NotebookNode:
    """Every way an output could run code or fetch a file, next to ordinary outputs."""
    hijack = "window.pwned = '{}'; document.title = 'pwned'"
    notebook = new_notebook(metadata={"widgets": {"application/vnd.jupyter.widget-state+json": {
        "state": {"m1": {"model_name": "HTMLModel", "state": {"value": "<script>window.pwned='w'</script>"}}},
        "version_major": 2, "version_minor": 0}}, "language_info": {"name": "python", "pygments_lexer": "<x>"}})
    notebook.cells = [
        new_markdown_cell("# Exercise 1\n\nSome *emphasis*.\n\n"
                          f"<script>{hijack.format('markdown')}</script>\n\n"
                          f"<img src=\"{TRAP}/md.png\" onerror=\"{hijack.format('md-onerror')}\">\n\n"
                          f"![remote]({TRAP}/md2.png) [a link](javascript:{hijack.format('href')})"),
        new_code_cell("print('hello from the student')\nshow(table)", execution_count=3, outputs=[
            new_output("stream", name="stdout", text="hello from the student\n"),
            new_output("display_data", data={
                "text/html": (f"<script>{hijack.format('html')}</script>"
                              f"<img src=x onerror=\"{hijack.format('onerror')}\">"
                              f"<iframe src=\"{TRAP}/frame\" onload=\"{hijack.format('iframe')}\"></iframe>"
                              "<iframe srcdoc=\"<script>parent.pwned='srcdoc'</script>\"></iframe>"
                              f"<link rel=\"stylesheet\" href=\"{TRAP}/style.css\">"
                              f"<style>@import url({TRAP}/import.css);</style>"
                              f"<div style=\"background: url({TRAP}/bg.png)\">styled</div>"
                              f"<img src=\"{TRAP}/remote.png\">"
                              "<table id=\"losses\"><thead><tr><th>step</th><th>loss</th></tr></thead>"
                              "<tbody><tr><td>1</td><td>0.25</td></tr></tbody></table>"),
                "text/plain": "<IPython.core.display.HTML object>"}),
            new_output("display_data", data={"application/javascript": hijack.format("javascript")}),
            new_output("display_data", data={
                "application/vnd.jupyter.widget-view+json": {"model_id": "m1", "version_major": 2, "version_minor": 0},
                "text/plain": "HTML(value='')"}),
            new_output("display_data", data={"image/svg+xml": (
                "<svg xmlns='http://www.w3.org/2000/svg' width='10' height='10'>"
                f"<script>{hijack.format('svg')}</script><image href='{TRAP}/svg.png' width='5' height='5'/></svg>")}),
            new_output("display_data", data={"image/png": png(7, 5), "text/plain": "<Figure size 7x5>"},
                       metadata={"image/png": {"width": f"7 onload=\"{hijack.format('width')}\""}}),
            new_output("execute_result", execution_count=3, data={"text/plain": "tensor(0.2500)"}),
        ]),
        new_code_cell("boom()", execution_count=4, outputs=[
            new_output("error", ename="NameError", evalue="name 'boom' is not defined",
                       traceback=["\x1b[0;31mNameError\x1b[0m: name 'boom' is not defined <script>x</script>"])]),
        # code is escaped by the highlighter alone
        new_code_cell(f"</pre></div><script>{hijack.format('source')}</script>\n"
                      f"<img src=x onerror=\"{hijack.format('source-onerror')}\">", execution_count=5),
        new_raw_cell(f"<script>{hijack.format('raw')}</script>", metadata={"raw_mimetype": "text/html"}),
    ]
    return notebook


def hostile_bytes() -> bytes:
    return nbformat.writes(hostile_notebook()).encode()


def test_the_page_holds_no_script_and_nothing_that_loads_and_shows_what_was_tried():
    page = render_executed(hostile_bytes(), "hostile")
    lowered = page.lower()
    assert "<script" not in lowered and "<iframe" not in lowered and "<link" not in lowered
    assert first_loader(page) == ""
    assert "default-src 'none'" in page and "http-equiv=\"Content-Security-Policy\"" in page
    for shown in ("hello from the student", "tensor(0.2500)", "<th>loss</th>", "<td>0.25</td>",
                  "<em>emphasis</em>", "NameError", "data:image/png;base64,"):
        assert shown in page, shown
    # what student code tried is shown as text, and the dropped outputs are named
    assert "&lt;script&gt;window.pwned = 'html'" in page and "&lt;script&gt;window.pwned = 'markdown'" in page
    assert "application/javascript output not shown" in page
    assert "application/vnd.jupyter.widget-view+json output not shown" in page
    assert "mathjax" not in lowered and "require.js" not in lowered and "cdnjs" not in lowered


def test_no_remote_url_survives_outside_escaped_text():
    """Every TRAP URL left on the page is inside text the sanitizer escaped, never an attribute."""
    import html.parser

    attributes: list[str] = []

    class Collect(html.parser.HTMLParser):
        def handle_starttag(self, tag, attrs):
            attributes.extend(f"{tag} {name}={value}" for name, value in attrs)

    Collect().feed(render_executed(hostile_bytes(), "hostile"))
    assert attributes and not [a for a in attributes if "127.0.0.1" in a or "javascript:" in a]
    assert not [a for a in attributes if a.split(" ", 1)[1].startswith("on")]
    assert [a for a in attributes if a.startswith("img src=")] and all(
        a.startswith("img src=data:image/") for a in attributes if a.startswith("img src="))


@pytest.mark.parametrize("snippet, found", [
    ("<script>alert(1)</script>", "a <script> element"),
    ("<SCRIPT SRC=//x></SCRIPT>", "a <script> element"),
    ("<iframe srcdoc='x'></iframe>", "a <iframe> element"),
    ("<link rel=stylesheet href=http://x/s.css>", "a <link> element"),
    ("<img src='http://x/a.png'>", "a <img> loading 'http://x/a.png'"),
    ("<img src=' data:image/png;base64,AA' onerror='x()'>", "a onerror attribute on <img>"),
    ("<img srcset='http://x/a.png 2x' src='data:image/png;base64,AA'>", "a srcset attribute on <img>"),
    ("<div style='background:URL(http://x/b.png)'>x</div>", "a style attribute on <div> loading a file"),
    ("<style>@im\\port url(http://x/i.css);</style>", "a stylesheet that loads a file"),
    ("<a href=' JavaScript:alert(1)'>x</a>", "a <a> linking to 'javascript:alert(1)'"),
    ("<meta http-equiv=refresh content='0;url=http://x'>", "a <meta http-equiv='refresh'>"),
    ("<svg><image href='http://x/a.png'/></svg>", "a <svg> element"),
])
def test_the_final_check_refuses_a_page_that_could_still_load_or_run_anything(snippet, found):
    clean = render_executed(nbformat.writes(new_notebook(cells=[new_markdown_cell("fine")])).encode(), "x")
    assert first_loader(clean) == ""
    assert first_loader(clean.replace("<main>", "<main>" + snippet)) == found


def test_a_page_the_final_check_refuses_is_not_written(tmp_path, monkeypatch):
    folder = tmp_path / "s1"
    folder.mkdir()
    (folder / EXECUTED_NOTEBOOK).write_bytes(hostile_bytes())
    # a sanitizer that let everything through: the check of the finished page still refuses it
    monkeypatch.setattr(SanitizeHTML, "sanitize_html_tags", lambda self, html: html)
    executed._exporter.cache_clear()
    try:
        page, note = write_executed_page(folder)
    finally:
        monkeypatch.undo()
        executed._exporter.cache_clear()
    assert page is None and not (folder / EXECUTED_PAGE).exists()
    assert note == f"{EXECUTED_NOTEBOOK} not shown: the rendered page would still hold a <script> element"


def test_a_page_is_rendered_again_only_when_its_notebook_or_the_renderer_changed(tmp_path, monkeypatch):
    """Rendering costs seconds per notebook, and every `grader report` rewrites the pages."""
    folder = tmp_path / "s1"
    folder.mkdir()
    (folder / EXECUTED_NOTEBOOK).write_bytes(hostile_bytes())
    page, _ = write_executed_page(folder)
    first = page.read_text()
    calls = []
    real = executed.render_executed
    monkeypatch.setattr(executed, "render_executed", lambda data, sid: calls.append(sid) or real(data, sid))
    assert write_executed_page(folder) == (page, "") and calls == [] and page.read_text() == first
    notebook = hostile_notebook()
    notebook.cells.append(new_code_cell("print('one more cell')"))
    (folder / EXECUTED_NOTEBOOK).write_text(nbformat.writes(notebook))
    write_executed_page(folder)
    assert calls == ["s1"] and "one more cell" in page.read_text()
    monkeypatch.setattr(executed, "_renderer_digest", lambda: "0" * 64)   # the renderer changed
    write_executed_page(folder)
    assert calls == ["s1", "s1"]
    page.write_text("<!-- g2c-made-from forged -->\n<p>not the grader's page</p>")   # a page it did not write
    write_executed_page(folder)
    assert calls == ["s1", "s1", "s1"] and "one more cell" in page.read_text()


def broken_notebooks() -> dict[str, tuple[bytes, str]]:
    valid = json.loads(hostile_bytes())
    no_name = json.loads(json.dumps(valid))
    del no_name["cells"][1]["outputs"][0]["name"]   # a stream output must have a name
    return {
        "not_json": (b'{"cells": [ {"cell_type": ', "it is not a notebook (NotJSONError: "),
        "a_list": (b"[1, 2]", "it is not a notebook (AttributeError: "),
        "too_deep": (b"[" * 100_000 + b"]" * 100_000, "it is not a notebook (RecursionError: "),
        "latin1": ("{\"cells\": \"\xe9\"}".encode("latin-1"), "it is not UTF-8 text"),
        "version3": (json.dumps({"nbformat": 3, "nbformat_minor": 0, "metadata": {}, "worksheets": []}).encode(),
                     "it is nbformat 3, not 4"),
        "invalid": (json.dumps(no_name).encode(), "it is not a valid nbformat 4 notebook (NotebookValidationError: 'name' is a required property)"),
    }


@pytest.mark.parametrize("name", list(broken_notebooks()))
def test_a_notebook_that_is_not_one_gives_no_page_and_a_reason(tmp_path, name):
    data, reason = broken_notebooks()[name]
    folder = tmp_path / name
    folder.mkdir()
    (folder / EXECUTED_NOTEBOOK).write_bytes(data)
    (folder / EXECUTED_PAGE).write_text("a page from an earlier run")
    page, note = write_executed_page(folder)
    assert page is None and not (folder / EXECUTED_PAGE).exists()   # never a stale page
    assert note.startswith(f"{EXECUTED_NOTEBOOK} not shown: {reason}"), note


def test_a_notebook_that_is_too_large_or_a_link_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setattr(executed, "MAX_EXECUTED_NOTEBOOK_BYTES", 2**20)
    big = tmp_path / "big"
    big.mkdir()
    (big / EXECUTED_NOTEBOOK).write_bytes(b" " * 2**20 + hostile_bytes())
    assert write_executed_page(big) == (None, f"{EXECUTED_NOTEBOOK} is over the 1 MiB limit")
    linked = tmp_path / "linked"
    linked.mkdir()
    os.symlink(big / EXECUTED_NOTEBOOK, linked / EXECUTED_NOTEBOOK)
    page, note = write_executed_page(linked)
    assert page is None and note == f"{EXECUTED_NOTEBOOK} is a symbolic link (submit the file itself)"
    assert write_executed_page(tmp_path) == (None, "")   # no executed notebook: nothing to say


def recorded(submission_id: str, executed_notebook: bytes | None) -> GradeResult:
    item = ItemResult("notebook_runs", "The notebook runs", 1.0, 1.0, "passed", "ran", [], "visible")
    result = GradeResult(submission_id, "linear_attention", "0.3.0", "ab" * 32, [item], execution_time=3.0)
    result.artifacts = {EXECUTED_NOTEBOOK: executed_notebook} if executed_notebook is not None else {}
    return result


@pytest.fixture
def out(tmp_path) -> Path:
    """A batch's output folder after `write_pages`: a hostile executed notebook, a broken one
    and none at all."""
    for result in (recorded("hostile", hostile_bytes()), recorded("broken", b'{"cells": ['),
                   recorded("never_ran", None)):
        write_result(tmp_path, result)
    write_pages(tmp_path, read_results(tmp_path))
    return tmp_path


def test_review_links_the_page_the_student_page_does_not_and_a_broken_notebook_is_named(out):
    assert (out / "hostile" / EXECUTED_PAGE).is_file()
    assert 'href="executed.html"' in (out / "hostile" / REVIEW_PAGE).read_text()
    for submission_id in ("hostile", "broken", "never_ran"):
        assert EXECUTED_PAGE not in (out / submission_id / REPORT_PAGE).read_text()
    broken = (out / "broken" / REVIEW_PAGE).read_text()
    assert not (out / "broken" / EXECUTED_PAGE).exists() and 'href="executed.html"' not in broken
    assert "No executed notebook page: executed.ipynb not shown: it is not a notebook (NotJSONError" in broken
    assert 'id="executed"' not in (out / "never_ran" / REVIEW_PAGE).read_text()


def test_in_chromium_no_script_runs_no_request_leaves_and_the_outputs_show(out):
    assert CHROMIUM.is_file(), f"{CHROMIUM} is missing: run `make install` (it installs Debian's chromium)"
    executed_url = (out / "hostile" / EXECUTED_PAGE).as_uri()
    requests: list[str] = []
    aborted: list[str] = []
    problems: list[str] = []
    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page()
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))

            def only_the_pages(route) -> None:
                if route.request.url.startswith(out.as_uri()):
                    route.continue_()
                else:
                    aborted.append(route.request.url)
                    route.abort()

            page.route("**/*", only_the_pages)
            page.goto((out / "hostile" / REVIEW_PAGE).as_uri())
            page.click("#executed a")   # the TA's way in
            page.wait_for_load_state("load")
            page.wait_for_timeout(500)   # time for any handler or late load to fire
            assert page.url == executed_url
            assert page.evaluate("typeof window.pwned") == "undefined"
            assert page.evaluate("typeof parent.pwned") == "undefined"
            assert page.title() == "executed notebook: hostile"
            counts = page.evaluate("""() => Object.fromEntries(
                ['script', 'iframe', 'link', 'object', 'embed', 'svg', 'style'].map(
                    t => [t, document.getElementsByTagName(t).length]))""")
            assert counts == {"script": 0, "iframe": 0, "link": 0, "object": 0, "embed": 0, "svg": 0, "style": 1}
            # the code and its ordinary outputs are there, the image decoded from its data: URI
            assert "print('hello from the student')" in page.inner_text(".nb-code .nb-input")
            assert "hello from the student" in page.inner_text(".nb-stream")
            assert page.locator("text=tensor(0.2500)").count() == 1
            assert page.locator(".nb-html table th").all_inner_texts() == ["step", "loss"]
            assert page.locator(".nb-html table td").all_inner_texts() == ["1", "0.25"]
            image = page.locator("img.nb-image[alt='image output']")
            assert image.evaluate("i => [i.complete, i.naturalWidth, i.naturalHeight]") == [True, 7, 5]
            assert page.locator("text=application/javascript output not shown").count() == 1
            assert "NameError" in page.inner_text(".nb-error")
        finally:
            browser.close()
    pages = {(out / "hostile" / REVIEW_PAGE).as_uri(), executed_url}
    assert aborted == [] and set(requests) <= pages and executed_url in requests
    assert problems == []
