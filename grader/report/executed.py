"""The executed notebook as a page for TAs: ``DIR/<id>/executed.html``, linked from review.html.

The notebook was written by student code inside the sandbox, so it is hostile: its outputs
may carry ``<script>``, event handlers, iframes, JavaScript and widget outputs, remote images
and stylesheets. The page is rendered by nbconvert's ``HTMLExporter`` with ``sanitize_html``
on, from the template in ``templates/executed/`` (not nbconvert's lab or classic templates,
which add MathJax and require.js from a CDN and print widget state into ``<script>``):

- output types are chosen by ``SHOWN_TYPES`` (the exporter's ``display_data_priority``);
  any other, JavaScript and widget views among them, is named on the page, never rendered;
- HTML outputs and Markdown (cells and outputs, after conversion) go through nbconvert's
  ``SanitizeHTML`` with the allow-list below: no script, style, iframe, form, image or any
  attribute that runs code or loads a file survives, and what it refuses is shown as text;
- images are data: URIs written by the template (an SVG as an ``<img>``, which runs nothing);
- a Content-Security-Policy that allows nothing but inline style and data: images, and a check
  of the finished page (``first_loader``) that refuses to write one that could still run or
  load anything, are the second and third lines of defence.

The page's size does not depend on the notebook's: each cell's source is cut at
``MAX_SOURCE_CHARS`` (its highlighted HTML is then at most about 30 bytes a character), and
cells are shown in order while their rendered HTML fits in ``MAX_CELLS_BYTES``; the first one
that does not, and every cell after it, are left out, and the page says how many and that
executed.ipynb holds them all. So the page is at most its head and stylesheet (about 20 KB),
``MAX_CELLS_BYTES`` and that one sentence.

A notebook that cannot be read (absent, a link, over the size limit, not JSON, not a valid
nbformat 4 notebook) or rendered gives no page and a reason: one submission's notebook never
stops the pages of the others.
"""
from __future__ import annotations

import functools
import hashlib
import html.parser
import re
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nbformat

from grader.execute import MAX_EXECUTED_NOTEBOOK_BYTES
from grader.pipeline import EXECUTED_NOTEBOOK
from grader.untrusted import read_regular

if TYPE_CHECKING:   # nbconvert takes about a second to import: only a page that is rendered needs it
    from nbconvert.exporters import HTMLExporter

EXECUTED_PAGE = "executed.html"
TEMPLATES = Path(__file__).parent / "templates"
TEMPLATE_NAME = "executed"   # the nbconvert template folder under TEMPLATES
MAX_NOTE_CHARS = 300
MAX_SOURCE_CHARS = 20_000        # of one cell's source (the course's longest cell is about 6,400)
MAX_CELLS_BYTES = 5_000_000      # of the cells' rendered HTML on one page

# Output types the page shows, best first. The first one an output holds is shown; the
# others it holds that are not listed (application/javascript, widget views, Mermaid, PDF,
# anything a notebook makes up) are named, so a TA sees that a cell tried.
SHOWN_TYPES = ("text/html", "text/markdown", "image/svg+xml", "image/png", "image/jpeg",
               "text/latex", "text/plain")
# Nothing may load: inline style only (the page's own), images only as data: URIs, no script.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"

# What student HTML and Markdown may keep: text structure and tables. No <img> (a student's
# image would be a file or a URL to fetch; the notebook's own image outputs are data: URIs
# the template writes), no style or id (ids would clobber the page's own), links only as
# http(s), mailto or relative (SanitizeHTML's protocols), which load nothing until clicked.
ALLOWED_TAGS = ["a", "abbr", "acronym", "b", "blockquote", "br", "caption", "code", "dd", "del",
                "div", "dl", "dt", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "i", "kbd",
                "li", "mark", "ol", "p", "pre", "s", "samp", "small", "span", "strong", "sub",
                "sup", "table", "tbody", "td", "tfoot", "th", "thead", "tr", "u", "ul", "var"]
ALLOWED_ATTRIBUTES = {"a": ["href", "title", "class"], "abbr": ["title", "class"],
                      "acronym": ["title", "class"], "td": ["colspan", "rowspan", "class"],
                      "th": ["colspan", "rowspan", "class"], "*": ["class"]}

# Elements and attributes the finished page must not hold (first_loader).
_LOADING_TAGS = {"script", "iframe", "frame", "frameset", "object", "embed", "applet", "link",
                 "base", "form", "audio", "video", "source", "track", "portal", "svg", "math"}
_LOADING_ATTRIBUTES = {"srcset", "poster", "background", "action", "formaction", "data", "ping",
                       "xlink:href", "lowsrc", "dynsrc"}


def write_executed_page(folder: Path) -> tuple[Path | None, str]:
    """Render ``folder/executed.ipynb`` as ``folder/executed.html``: (the page, "") or (None,
    why there is none; "" when the folder has no executed notebook). Never raises for what
    the notebook holds; a page from an earlier run is removed when this one cannot be made."""
    page = folder / EXECUTED_PAGE
    data, why = read_regular(folder / EXECUTED_NOTEBOOK, folder, MAX_EXECUTED_NOTEBOOK_BYTES)
    made_from = _made_from(data) if data is not None else ""
    if made_from and page_made_from(page) == made_from:
        return page, ""   # rendering costs seconds: a page of the same notebook by the same renderer stays
    page.unlink(missing_ok=True)
    if data is None:
        if why == "absent":
            return None, ""
        if why == "too large":
            why = f"over the {MAX_EXECUTED_NOTEBOOK_BYTES // 2**20} MiB limit"
        return None, f"{EXECUTED_NOTEBOOK} is {why}"
    text, why = executed_page(data, folder.name)
    if text is None:
        return None, why
    page.write_text(text, encoding="utf-8")
    return page, ""


def executed_page(data: bytes, submission_id: str) -> tuple[str | None, str]:
    """The whole executed.html for an executed notebook's bytes, first line included: (the
    page, "") or (None, why there is none)."""
    try:
        text = render_executed(data, submission_id)
    except ValueError as exc:
        return None, f"{EXECUTED_NOTEBOOK} not shown: {exc}"
    return f"<!-- {MADE_FROM} {_made_from(data)} -->\n" + text, ""


def page_artifact(artifacts: dict[str, bytes], submission_id: str) -> dict[str, bytes]:
    """executed.html for the executed notebook among a result's artifacts, to be written beside
    it ({} when there is none or it cannot be shown: ``write_executed_page`` then says why).
    The worker that graded the submission makes it, so that a class's notebooks are rendered
    in parallel, not one after another by the coordinator once all are graded."""
    data = artifacts.get(EXECUTED_NOTEBOOK)
    if data is None or len(data) > MAX_EXECUTED_NOTEBOOK_BYTES:
        return {}
    text, _ = executed_page(data, submission_id)
    return {EXECUTED_PAGE: text.encode("utf-8")} if text is not None else {}


MADE_FROM = "g2c-made-from"   # the first line of a page: what it was rendered from, and by what


def cut(text: str, limit: int, full_text_in: str, keep_end: bool = False) -> str:
    """``text`` cut to its first ``limit`` characters (its last with ``keep_end``: a traceback's
    end says what raised), with a line saying what was cut and which file holds the full text;
    ``text`` itself when it is no longer. Every page cuts what a submission wrote with it."""
    if len(text) <= limit:
        return text
    notice = (f"[the {'last' if keep_end else 'first'} {limit:,} of {len(text):,} characters shown; "
              f"the full text is in {full_text_in}]")
    return f"{notice}\n{text[-limit:]}" if keep_end else f"{text[:limit]}\n{notice}"


class _CellBudget:
    """The cells one page shows: in order, while their rendered HTML fits in ``limit`` bytes
    (the template passes each cell's HTML through ``take``)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.shown = 0
        self.full = False

    def take(self, html: str) -> str:
        """``html`` when it fits in what is left, else "" (and no later cell is shown either)."""
        size = len(html.encode("utf-8"))
        if self.full or self.used + size > self.limit:
            self.full = True
            return ""
        self.used += size
        self.shown += 1
        return html


def _made_from(data: bytes) -> str:
    """The notebook's sha256 and the renderer's (this module, its template): a page made from
    both is the page this call would make."""
    return f"{hashlib.sha256(data).hexdigest()} {_renderer_digest()}"


@functools.cache
def _renderer_digest() -> str:
    parts = [Path(__file__).read_bytes(), *(p.read_bytes() for p in sorted((TEMPLATES / TEMPLATE_NAME).iterdir()))]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()


def page_made_from(page: Path) -> str:
    """What an existing page says it was made from (its first line, written with the page:
    two sha256 digests, of its inputs and of its renderer; "" when there is none to trust)."""
    try:
        with page.open("rb") as handle:   # the grader wrote it; the output folder is the TA's
            first = handle.readline(512).decode("ascii")
    except (OSError, UnicodeDecodeError):
        return ""
    found = re.fullmatch(rf"<!-- {MADE_FROM} ([0-9a-f]{{64}} [0-9a-f]{{64}}) -->\n", first)
    return found.group(1) if found else ""


def render_executed(data: bytes, submission_id: str) -> str:
    """The page for an executed notebook's bytes; ValueError with the reason when the bytes are
    not a valid nbformat 4 notebook, or the page could load or run anything."""
    notebook = _parse(data)
    # The page uses nothing from the notebook's metadata (the lexer is the course's, the title
    # the submission's id, widget state is never shown), and the exporter keeps a copy of it.
    notebook.metadata = nbformat.NotebookNode()
    for cell in notebook.cells:
        cell.source = cut(cell.source, MAX_SOURCE_CHARS, EXECUTED_NOTEBOOK)
    exporter = _exporter()
    resources = {"submission_id": submission_id, "csp": CSP, "inline_css": _css(),
                 "metadata": {"name": submission_id}, "cells": _CellBudget(MAX_CELLS_BYTES),
                 "notebook_file": EXECUTED_NOTEBOOK}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # "not able to be represented": the page names those
            page, _ = exporter.from_notebook_node(notebook, resources=resources)
    except Exception as exc:   # noqa: BLE001  nbconvert on hostile content: any failure is this notebook's
        raise ValueError(f"it could not be rendered ({_reason(exc)})") from None
    problem = first_loader(page)
    if problem:
        raise ValueError(f"the rendered page would still hold {problem}")
    return page


@functools.cache
def _exporter() -> HTMLExporter:
    """One exporter for every page: it compiles the template once."""
    from nbconvert.exporters import HTMLExporter
    from nbconvert.filters.highlight import Highlight2HTML
    from nbconvert.preprocessors.sanitize import SanitizeHTML
    from traitlets.config import Config

    sanitizer = SanitizeHTML(tags=ALLOWED_TAGS, attributes=ALLOWED_ATTRIBUTES, strip=False, strip_comments=True)
    return HTMLExporter(
        config=Config({"NbConvertBase": {"display_data_priority": list(SHOWN_TYPES)},
                       "HighlightMagicsPreprocessor": {"enabled": False}}),
        extra_template_basedirs=[str(TEMPLATES)], template_name=TEMPLATE_NAME,
        sanitize_html=True, exclude_anchor_links=True,
        filters={"clean_html": sanitizer.sanitize_html_tags,
                 # the course's language, not one the notebook's metadata names
                 "highlight_code": Highlight2HTML(pygments_lexer="ipython3"),
                 "dropped_types": dropped_types})


def dropped_types(data: dict[str, Any]) -> list[str]:
    """The output types of a mime bundle that the page does not render, sorted."""
    return sorted(str(kind) for kind in data if kind not in SHOWN_TYPES)


def first_loader(page: str) -> str:
    """The first element or attribute of ``page`` that could run code or load anything (a
    script, frame, stylesheet link, event handler, non-data: source, ``@import`` or ``url()``
    in a style element), described; "" when there is none."""
    finder = _LoaderFinder()
    finder.feed(page)
    finder.close()
    return finder.found


class _LoaderFinder(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found = ""
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._in_style = tag == "style"
        if self.found:
            return
        if tag in _LOADING_TAGS:
            self.found = f"a <{tag}> element"
        for name, value in attrs:
            value = re.sub(r"[\x00-\x20]", "", value or "").lower()
            if self.found:
                return
            if name.startswith("on") or name in _LOADING_ATTRIBUTES:
                self.found = f"a {name} attribute on <{tag}>"
            elif name == "src" and not value.startswith("data:"):
                self.found = f"a <{tag}> loading {value[:80]!r}"
            elif name == "href" and (tag != "a" or value.startswith(("javascript:", "vbscript:", "data:"))):
                self.found = f"a <{tag}> linking to {value[:80]!r}"
            elif name == "style" and ("url(" in value or "@import" in value):
                self.found = f"a style attribute on <{tag}> loading a file"
            elif tag == "meta" and name == "http-equiv" and value != "content-security-policy":
                self.found = f"a <meta http-equiv={value[:40]!r}>"

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        self._in_style = False

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        compact = re.sub(r"\s|\\", "", data).lower()
        if self._in_style and not self.found and ("@import" in compact or "url(" in compact):
            self.found = "a stylesheet that loads a file"


def _parse(data: bytes) -> nbformat.NotebookNode:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("it is not UTF-8 text") from None
    try:
        notebook = nbformat.reader.reads(text)
    except Exception as exc:   # noqa: BLE001  JSON and nbformat errors of every kind, and RecursionError
        raise ValueError(f"it is not a notebook ({_reason(exc)})") from None
    if notebook.get("nbformat") != 4:
        raise ValueError(f"it is nbformat {str(notebook.get('nbformat'))[:20]}, not 4")
    try:
        nbformat.validate(notebook)
    except Exception as exc:   # noqa: BLE001  ValidationError, or the validator failing on odd input
        raise ValueError(f"it is not a valid nbformat 4 notebook ({_reason(exc)})") from None
    return notebook


def _reason(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return text if len(text) <= MAX_NOTE_CHARS else text[:MAX_NOTE_CHARS] + " ..."


@functools.cache
def _css() -> str:
    """The report pages' stylesheet and Pygments' colours (the template adds the notebook's
    own rules), inline."""
    from pygments.formatters import HtmlFormatter

    return "\n".join([(TEMPLATES / "style.css").read_text(encoding="utf-8"),
                      HtmlFormatter().get_style_defs(".highlight")])
