"""The website as readers see it: every page opened in headless Chromium.

The book is built once per session (``book_build``), ``_build/html`` is served
on 127.0.0.1, and each page is opened twice: at 1280 px (a laptop) and at 390 px
(a phone). On every page, at both widths: no JavaScript error, no failed request
to the local server (a broken link, image, stylesheet or script), every image
loaded, every formula typeset by MathJax (the site carries its own MathJax;
nothing comes from the internet) with no raw TeX left in the text, and:

- the page never scrolls sideways, and nothing sticks out of the article: what
  is wider than the screen (a code cell, a printed table, a formula, a table)
  scrolls inside its own box;
- code and printed outputs keep their line structure (never wrapped), and only
  code, outputs, math and tables may scroll;
- at 1280 px every code box (also in an exercise or a solution, opened) holds a
  line of the project's line length, 88 columns (``[tool.ruff] line-length``):
  code formatted by ruff shows without wrapping or scrolling;
- display math: at 1280 px no formula is wider than the column (none needs its
  scroll bar), and at 390 px a long one scrolls inside its own box with nothing
  cut off above or below (the superscript of QK^T, a tall fraction).

Accessibility, at 1280 px on the same page load: axe-core (the copy inside
axe-playwright-python, nothing downloaded) checks WCAG 2.1 A and AA in light mode
with every rule, and in dark mode (``data-theme="dark"``, pydata-sphinx-theme's
switch) with the rules that depend on colour; a serious or critical finding fails.
A link reached with the Tab key shows a focus ring in both modes, and a figure gets
the column width that tests/book/test_figures.py sizes its labels with.

Each page is loaded once, at 1280 px, checked, then narrowed to 390 px and checked
again: loading a page and typesetting its math is most of a visit's time, and the
layout at 390 px is CSS media queries, which the narrowed window applies as a phone
loading the page would. ``SCREENSHOTS=1`` (``make screenshots``) also writes a
full-page screenshot of each page at each width to
``_build/screenshots/<page>@<width>.png``, for people to look at; they take longer
than the checks, so the test run leaves them out by default.

Needs Debian's Chromium (``apt-get install chromium``); Playwright drives it
through ``executable_path``, so ``playwright install`` is never needed
(``CHROMIUM=/path/to/chrome`` picks another build). Outside CI the tests skip
when it is missing; under CI (``CI=true``) they fail.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import threading
import tomllib
from pathlib import Path

import pytest
from _site_geometry import CONTENT_WIDTH_390

ROOT = Path(__file__).resolve().parents[2]
HTML = ROOT / "_build" / "html"
SCREENSHOTS = ROOT / "_build" / "screenshots"
# Full-page screenshots are for people to look at, not part of the checks: a
# long page takes seconds to a minute to capture, so only SCREENSHOTS=1 takes them.
TAKE_SCREENSHOTS = os.environ.get("SCREENSHOTS", "0") not in ("", "0")
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    # No internet here or in CI: other hosts' names do not resolve, so a request to
    # one fails at once. Not a route: Playwright turns the HTTP cache off for a
    # context with routes, and every page then fetched and compiled all the theme's
    # and MathJax's scripts again (a fifth of the CPU of a visit).
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
]
# A laptop, and a phone (the CSS width of most phones is 360 to 430 px).
WIDTHS = (1280, 390)
LAPTOP = 1280
HEIGHT = 900
# The one line length of the library and of the chapters' code cells.
LINE_LENGTH = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"][
    "line-length"
]
# Sphinx's own pages, next to the ones listed in _toc.yml.
EXTRA_PAGES = ["genindex", "search", "py-modindex"]
# Raw TeX that MathJax would have replaced: display and inline delimiters, environments,
# and $...$ holding TeX syntax (a formula that MyST did not recognize as math).
RAW_TEX = re.compile(r"\$\$|\\\(|\\\)|\\\[|\\\]|\\begin\{|\$[^$\n]*[\\^_{}][^$\n]*\$")

# The buttons on every chapter, from launch_buttons, repository and html in _config.yml.
LAUNCH_LINKS = {
    "Colab": r"^https://colab\.research\.google\.com/github/.+\.ipynb$",
    "Binder": r"^https://mybinder\.org/v2/gh/.+\.ipynb$",
    ".ipynb download": r"^(\.\./)*_sources/.+\.ipynb$",
    "edit on GitHub": r"^https://github\.com/.+/edit/.+\.ipynb$",
    "repository": r"^https://github\.com/[^/]+/[^/]+/?$",
}

# WCAG 2.1 level A and AA, as axe-core tags its rules. In dark mode only the rules
# that depend on colour run again: the others read the DOM and ARIA attributes,
# which the mode leaves as they are.
# "Label in name" (WCAG 2.5.3, level A) is still marked experimental in axe-core 4.12,
# which leaves it out of the tag sets: it is turned on by name.
AXE_LIGHT = {
    "runOnly": {"type": "tag", "values": ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]},
    "rules": {"label-content-name-mismatch": {"enabled": True}},
    "resultTypes": ["violations"],
}
AXE_DARK = {
    "runOnly": {"type": "rule", "values": ["color-contrast", "link-in-text-block"]},
    "resultTypes": ["violations"],
}
AXE_FAILS = ("serious", "critical")
pytestmark = pytest.mark.slow


def _pages() -> list[str]:
    """Every page of the book: _toc.yml's entries, then Sphinx's index and search
    pages."""
    toc = (ROOT / "_toc.yml").read_text()
    entries = re.findall(
        r"^\s*(?:root|-?\s*file):\s*(\S+?)(?:\.md|\.ipynb)?\s*$", toc, re.MULTILINE
    )
    return ["index", *entries, *EXTRA_PAGES]


PAGES = _pages()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


# The website builds with warnings as errors (in this file, with the other tests of
# the built site: under xdist a worker that takes it waits for the build).
@pytest.mark.slow  # a full build: `make test-fast` leaves it out
def test_book_builds_without_warnings(book_build):
    output = book_build.stdout + book_build.stderr
    warnings = [
        line for line in output.splitlines() if re.search(r"WARNING|ERROR", line)
    ]
    assert book_build.returncode == 0, output[-5000:]
    assert not warnings, "\n".join(warnings)
    assert (ROOT / "_build" / "html" / "index.html").exists()


@pytest.fixture(scope="session")
def site(book_build):
    """The built site served on a free port of 127.0.0.1; yields its base URL."""
    if not (HTML / "index.html").exists():
        pytest.fail(
            "the book did not build (see test_book.py):\n"
            + (book_build.stdout + book_build.stderr)[-3000:]
        )
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        message = (
            f"{CHROMIUM} not found: install Debian's Chromium with "
            "`apt-get install chromium`"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        browser = _Browser(chromium)
        yield browser
        browser.discard()
        chromium.close()


# Each new document starts with empty storage, as in a new browser context: the theme
# keeps the sidebar's scroll position in sessionStorage from one page to the next.
_FRESH_STORAGE = """
if (window === window.top) {
  try { localStorage.clear(); sessionStorage.clear(); } catch (error) {}
}
"""


class _Browser:
    """Chromium, and one tab that visits the pages one after another.

    Opening a tab starts a renderer process (about half a second); a visit that
    leaves the tab as it found it (on about:blank, no cookies, and each document
    starting with empty storage) reuses it. A visit that moves the mouse asks for
    a new tab (``fresh``) and closes it after itself (``close_tab``): the pointer
    would stay where it clicked. Tabs come from one browser context, whose HTTP
    cache keeps the scripts, styles and fonts every page loads (and V8's code for
    them); a tab that cannot be trusted any more takes its context with it
    (``discard``).
    """

    def __init__(self, chromium):
        self.chromium = chromium
        self._context = None
        self._tab = None

    def tab(self, fresh: bool = False):
        if fresh:
            self.close_tab()
        if self._context is None:
            self._context = self.chromium.new_context()
            self._context.add_init_script(_FRESH_STORAGE)
        if self._tab is None or self._tab.is_closed():
            self._tab = self._context.new_page()
            self._tab.set_default_timeout(30_000)
        self._context.clear_cookies()
        return self._tab

    def close_tab(self):
        if self._tab is not None:
            self._tab.close()
        self._tab = None

    def discard(self):
        if self._context is not None:
            self._context.close()
        self._context = self._tab = None


class _Visit:
    """One page opened in the browser's tab, with everything that went wrong."""

    def __init__(self, browser, base: str, page: str, width: int, fresh=False):
        self.base = base
        self.browser = browser
        self.problems: list[str] = []
        self.page = browser.tab(fresh)
        self.page.set_viewport_size({"width": width, "height": HEIGHT})
        self.listeners = {
            "pageerror": lambda error: self.problems.append(
                f"JavaScript error: {error}"
            ),
            "console": self._console,
            "requestfailed": self._request_failed,
            "response": self._response,
        }
        for event, listener in self.listeners.items():
            self.page.on(event, listener)
        self.url = f"{base}/{page}.html"
        self.leaving = False

    def _local(self, url: str) -> bool:
        return url.startswith(self.base + "/") or url == self.base

    def _console(self, message):
        url = (message.location or {}).get("url", "")
        # Failed requests to other hosts log "Failed to load resource" with their URL;
        # so does the browser's own request for /favicon.ico, which no page asks for
        # (the book declares no icon).
        if url == f"{self.base}/favicon.ico":
            return
        if message.type == "error" and (not url or self._local(url)):
            self.problems.append(f"console error: {message.text} ({url})")

    def _request_failed(self, request):
        # A load still under way when the visit leaves is aborted by the leaving,
        # not failed by the page (MathJax fetches a font when a formula first needs
        # it, e.g. after the window narrows).
        aborted = self.leaving and "ERR_ABORTED" in str(request.failure)
        if self._local(request.url) and not aborted:
            self.problems.append(f"request failed: {request.url} ({request.failure})")

    def _response(self, response):
        if self._local(response.url) and response.status >= 400:
            self.problems.append(f"HTTP {response.status}: {response.url}")

    def close(self):
        """Leave the page (what its unloading reports is the page's), and the tab
        blank for the next visit; a tab that cannot is replaced."""
        try:
            # The fonts the page asked for load first: one that fails still counts.
            self.page.evaluate(_FONTS_LOADED)
            self.leaving = True
            self.page.goto("about:blank")
        except Exception:
            self.browser.discard()
            raise
        finally:
            for event, listener in self.listeners.items():
                self.page.remove_listener(event, listener)


# The page's pending font loads, waited for (at most 10 s).
_FONTS_LOADED = """() => Promise.race([
  document.fonts.ready.then(() => true),
  new Promise(done => setTimeout(() => done(false), 10000)),
])"""

# Everything checked inside the page, in one round trip: MathJax, images, TeX, widths.
_INSPECT = r"""
async ([lineLength, checkColumns]) => {
  const article = document.querySelector("article.bd-article")
      || document.querySelector("main") || document.body;
  const startup = window.MathJax && window.MathJax.startup;
  const mathjax = startup ? startup.promise : null;
  const hasMath = document.querySelector(".math") !== null;
  let mathjaxLoaded = false;
  if (mathjax) { await mathjax; mathjaxLoaded = true; }
  // Images below the fold may be lazy: load them all, then wait for each.
  const images = [...document.images];
  images.forEach(img => { img.loading = "eager"; });
  await Promise.all(images.map(img => img.complete ? null : new Promise(done => {
    img.addEventListener("load", done);
    img.addEventListener("error", done);
    setTimeout(done, 10000);
  })));
  const brokenImages = images.filter(img => !(img.complete && img.naturalWidth > 0))
      .map(img => img.getAttribute("src"));
  // Formulas MathJax left untypeset, or typeset as an error (bad TeX).
  const untypeset = [...document.querySelectorAll(".math")]
      .filter(el => !el.closest("pre, code") && !el.querySelector("mjx-container"))
      .map(el => el.textContent.trim().slice(0, 80));
  const mathErrors = [...document.querySelectorAll("mjx-merror")]
      .map(el => (el.getAttribute("data-mjx-error") || el.textContent).slice(0, 80));
  // Text a reader sees, less code and typeset math.
  const hidden = "pre, code, script, style, textarea, mjx-container, .highlight";
  // An element that matches leaves out its whole subtree: the same text nodes as
  // asking each text node's parent for .closest(hidden) (the article and what holds
  // it match none), without the climbs.
  const walker = document.createTreeWalker(
    article, NodeFilter.SHOW_ELEMENT | NodeFilter.SHOW_TEXT, {
      acceptNode: node => node.nodeType !== Node.ELEMENT_NODE ? NodeFilter.FILTER_ACCEPT
          : node.matches(hidden) ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_SKIP,
    });
  const texts = [];
  while (walker.nextNode()) texts.push(walker.currentNode.textContent);
  // Open the dropdowns (the solutions of the exercises): their code is checked too.
  // Once: the page is inspected again after narrowing, and a second click would
  // close what the first opened.
  if (!window.__dropdownsOpened) {
    window.__dropdownsOpened = true;
    document.querySelectorAll("details").forEach(details => { details.open = true; });
    document.querySelectorAll("button.toggle-button").forEach(b => b.click());
    // Their fade-ins and slides (sphinx-design, sphinx-togglebutton) jump to the
    // end: the page is checked as it looks once they have played.
    document.getAnimations()
        .filter(animation => animation.effect
            && animation.effect.getComputedTiming().endTime !== Infinity)
        .forEach(animation => animation.finish());
  }
  // Two frames: the layout of a window just narrowed has settled.
  await new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)));
  // Nothing sticks out of the article: what is wider scrolls inside its own box.
  const right = Math.min(article.getBoundingClientRect().right, window.innerWidth);
  const canvas = document.createElement("canvas").getContext("2d");
  const columns = pre => {  // how many characters of the code font fit on a line
    const style = getComputedStyle(pre);
    canvas.font = `${style.fontSize} ${style.fontFamily}`;
    const padding = parseFloat(style.paddingLeft) + parseFloat(style.paddingRight);
    return Math.floor((pre.clientWidth - padding) / canvas.measureText("m").width);
  };
  const describe = el => {
    if (el.tagName === "PRE") {  // name the longest line, and how many characters fit
      const longest = el.textContent.split("\n")
          .reduce((a, b) => b.length > a.length ? b : a, "");
      return `a line of ${longest.length} characters where ${columns(el)} fit: `
          + JSON.stringify(longest.trim().slice(0, 70));
    }
    let text = el.textContent;
    try {  // a formula: its TeX source
      text = window.MathJax.startup.document.getMathItemsWithin(el)[0].math;
    } catch (error) {}
    return JSON.stringify(text.trim().split("\n")[0].slice(0, 70));
  };
  // Nothing changes the page while it is measured: each element's style, box and
  // answers are computed once (a formula has thousands of nested elements, and
  // each asked for all its ancestors' styles).
  const memo = compute => {
    const answers = new Map();
    return el => {
      let answer = answers.get(el);
      if (answer === undefined) { answer = compute(el); answers.set(el, answer); }
      return answer;
    };
  };
  const styleOf = memo(el => getComputedStyle(el));
  const boxOf = memo(el => el.getBoundingClientRect());
  const scrollsX = memo(el => ["auto", "scroll", "hidden"]
      .includes(styleOf(el).overflowX));
  // Whether an ancestor below the article scrolls sideways: the parent, or one of
  // the parent's.
  const insideScroller = memo(el => {
    const up = el.parentElement;
    return !!up && up !== article && (scrollsX(up) || insideScroller(up));
  });
  const name = el => el.tagName.toLowerCase()
      + (el.classList.length ? "." + el.classList[0] : "");
  const sticksOut = [], scrolling = [], wrapped = [], narrow = [], mathFixed = [];
  const mayScroll = "pre, div.math, span.math, mjx-container, table, div.highlight";
  for (const el of article.querySelectorAll("*")) {
    const box = boxOf(el);
    if (box.width === 0 || styleOf(el).visibility === "hidden") continue;
    const parent = el.parentElement;
    if (box.right > right + 1 && !insideScroller(el)
        && !(parent !== article && boxOf(parent).right > right + 1)) {
      sticksOut.push(`${name(el)} ends ${Math.round(box.right - right)} px past the `
          + `edge: ${describe(el)}`);
    }
    // Only code, outputs, formulas and tables may scroll sideways.
    if (scrollsX(el) && el.clientWidth > 0 && el.scrollWidth > el.clientWidth + 1
        && !el.matches(mayScroll) && !el.closest("mjx-container")) {
      scrolling.push(`${name(el)} scrolls sideways: ${describe(el)}`);
    }
  }
  for (const pre of article.querySelectorAll("pre")) {
    if (pre.getBoundingClientRect().width === 0) continue;
    const whiteSpace = getComputedStyle(pre).whiteSpace;
    if (whiteSpace !== "pre") {
      wrapped.push(`${describe(pre)} (white-space: ${whiteSpace})`);
    }
    if (checkColumns && columns(pre) < lineLength) {
      const box = pre.closest("div.cell_input, div.cell_output, div.highlight") || pre;
      narrow.push(`${name(box)} holds ${columns(pre)} columns, not ${lineLength}`);
    }
  }
  const displayMath = "div.math, mjx-container[display='true']";
  for (const math of article.querySelectorAll(displayMath)) {
    if (math.getBoundingClientRect().width > 0 && !scrollsX(math)) {
      mathFixed.push(`display math that cannot scroll: ${describe(math)}`);
    }
  }
  // A formula's box scrolls sideways, so it clips what sticks out above or below:
  // nothing may. On a laptop no formula may need its scroll bar at all.
  const mathCut = [];
  for (const math of article.querySelectorAll("mjx-container[display='true']")) {
    if (math.getBoundingClientRect().width === 0) continue;
    const wide = math.scrollWidth - math.clientWidth;
    const tall = math.scrollHeight - math.clientHeight;
    if (checkColumns && wide > 2) {
      mathCut.push(`display math ${wide} px wider than the column: ${describe(math)}`);
    } else if (tall > 1) {
      mathCut.push(`display math cut ${tall} px above or below: ${describe(math)}`);
    }
  }
  const codeBoxes = [...article.querySelectorAll("pre")]
      .filter(pre => pre.getBoundingClientRect().width > 0).length;
  const links = [...document.querySelectorAll("a[href]")]
      .map(a => a.getAttribute("href"));
  return {
    links,
    title: document.title, hasMath, mathjaxLoaded, brokenImages, untypeset, mathErrors,
    text: texts.join(" "), sticksOut, scrolling, wrapped, narrow, mathFixed, mathCut,
    codeBoxes,
    containers: document.querySelectorAll("mjx-container").length,
    pageWidth: document.documentElement.scrollWidth, viewport: window.innerWidth,
  };
}
"""


def _capped(problems: list[str], limit: int = 10) -> list[str]:
    """The first ``limit`` problems of one kind, and how many more there are."""
    return problems[:limit] + (
        [f"... and {len(problems) - limit} more like these"]
        if len(problems) > limit
        else []
    )


# What _check_page found on each page at WIDTHS: test_the_checks_see_the_code reads
# the visit of test_page_reads_well instead of opening the page again.
_CHECKED: dict[str, dict] = {}


def _check_page(browser, site, page, widths=WIDTHS):
    """Open ``page`` once at ``widths[0]``, then narrow the window to each further
    width; returns ``{width: (result, problems)}``."""
    if widths == WIDTHS and page in _CHECKED:
        return _CHECKED[page]
    visit = _Visit(browser, site, page, widths[0])
    results = {}
    try:
        response = visit.page.goto(visit.url, wait_until="load")
        assert response is not None and response.ok, (
            f"{visit.url}: {response and response.status}"
        )
        if page == "index":  # the root only redirects to the preface, checked itself
            visit.page.wait_for_url(f"{site}/{PAGES[1]}.html")
            visit.page.wait_for_load_state("load")
            title = {"title": visit.page.title()}
            return {width: (title, _capped(visit.problems)) for width in widths}
        for width in widths:
            if width != widths[0]:
                visit.page.set_viewport_size({"width": width, "height": HEIGHT})
            results[width] = visit.page.evaluate(
                _INSPECT, [LINE_LENGTH, width >= LAPTOP]
            )
            if TAKE_SCREENSHOTS:
                shot = SCREENSHOTS / f"{page}@{width}.png"
                shot.parent.mkdir(parents=True, exist_ok=True)
                visit.page.screenshot(path=str(shot), full_page=True, timeout=180_000)
    finally:
        visit.close()
    # Errors of the page (JavaScript, failed requests) are the same at every width.
    checked = {
        width: (result, _capped(visit.problems) + _layout_problems(page, result))
        for width, result in results.items()
    }
    if widths == WIDTHS:
        _CHECKED[page] = checked
    return checked


def _layout_problems(page, result):
    """What the inspection of one width found wrong."""
    problems = []
    if result["hasMath"] and not (result["mathjaxLoaded"] and result["containers"]):
        problems.append("the page has math but MathJax did not load or typeset it")
    else:  # MathJax ran: then each formula, and the text, must show no TeX
        problems += _capped(
            [f"math not typeset: {tex!r}" for tex in result["untypeset"]]
        )
        problems += _capped([f"MathJax error: {e!r}" for e in result["mathErrors"]])
        text = result["text"]
        around = [
            text[max(m.start() - 40, 0) : m.end() + 40] for m in RAW_TEX.finditer(text)
        ]
        problems += _capped([f"raw TeX in the text: ...{part!r}" for part in around])
    problems += _capped([f"image not loaded: {src}" for src in result["brokenImages"]])
    if result["pageWidth"] > result["viewport"]:
        problems.append(
            f"the page scrolls sideways: {result['pageWidth']} px in a "
            f"{result['viewport']} px window"
        )
    problems += _capped([f"sticks out: {item}" for item in result["sticksOut"]], 30)
    problems += _capped(result["scrolling"])
    problems += _capped([f"wraps its lines: {item}" for item in result["wrapped"]])
    problems += _capped([f"too narrow for code: {item}" for item in result["narrow"]])
    problems += _capped(result["mathFixed"])
    problems += _capped(result["mathCut"])
    if (ROOT / f"{page}.ipynb").exists():  # a chapter: launch it, download it, edit it
        for what, pattern in LAUNCH_LINKS.items():
            if not any(re.search(pattern, link) for link in result["links"]):
                problems.append(
                    f"no {what} link (launch_buttons / repository in _config.yml)"
                )
    return problems


def _set_mode(page, mode: str) -> None:
    """Light or dark, as the theme's switch sets it. Colour transitions are turned
    off first: axe-core must measure the colours the mode ends with, not a blend."""
    page.evaluate(
        """mode => {
          if (!document.getElementById("no-transitions")) {
            const style = document.createElement("style");
            style.id = "no-transitions";
            style.textContent = "* { transition: none !important; }";
            document.head.appendChild(style);
          }
          document.documentElement.dataset.theme = mode;
          document.documentElement.dataset.mode = mode;
        }""",
        mode,
    )


def _axe(page) -> list[str]:
    """axe-core's serious and critical findings on the open page, light and dark."""
    from axe_playwright_python.sync_playwright import Axe

    page.evaluate("() => window.MathJax && MathJax.startup && MathJax.startup.promise")
    page.evaluate(Axe().axe_script)
    findings = []
    for mode, options in (("light", AXE_LIGHT), ("dark", AXE_DARK)):
        _set_mode(page, mode)
        violations = page.evaluate("options => axe.run(document, options)", options)
        for rule in violations["violations"]:
            if rule.get("impact") not in AXE_FAILS:
                continue
            nodes = rule["nodes"]
            examples = "; ".join(
                f"{' '.join(map(str, node['target']))}: {node['html'][:100]!r}"
                for node in nodes[:3]
            )
            findings.append(
                f"{mode}: {rule['id']} ({rule['impact']}, {len(nodes)} elements: "
                f"{rule['help']}), e.g. {examples}"
            )
    _set_mode(page, "light")
    return findings


def test_every_built_page_is_checked(site):
    """No page escapes the browser test: each HTML file of the site is in PAGES."""
    built = {
        str(path.relative_to(HTML).with_suffix(""))
        for path in HTML.rglob("*.html")
        if not path.relative_to(HTML).parts[0].startswith("_")
    }
    assert built - set(PAGES) == set(), (
        "pages built but not checked (add them to _toc.yml or EXTRA_PAGES)"
    )
    assert set(PAGES) - built == set(), "pages checked but not built"


@pytest.mark.parametrize("page", PAGES)
def test_page_reads_well(browser, site, page):
    report = [
        f"at {width} px ({result['title']}):\n  " + "\n  ".join(problems)
        for width, (result, problems) in _check_page(browser, site, page).items()
        if problems
    ]
    assert not report, f"{page}.html " + "\n".join(report)


def test_the_checks_see_the_code(browser, site):
    # A check that finds nothing to check passes: make sure it measures code boxes, the
    # solutions' among them, and that a box holds a line of the line length.
    # The page's first inspection, at 1280 px (its visit in test_page_reads_well).
    result, _ = _check_page(browser, site, "chapters/05_gradients")[LAPTOP]
    assert result["codeBoxes"] >= 20
    assert 80 <= LINE_LENGTH <= 88


# axe-core takes 5 to 20 s a page (minutes for the API page): `make test-a11y` runs
# these, not `make test`, which must stay a suite people run often.
@pytest.mark.a11y
@pytest.mark.parametrize("page", [p for p in PAGES if p != "index"])
def test_page_is_accessible(browser, site, page):
    """No serious or critical axe-core finding (WCAG 2.1 AA), light or dark, on the
    page as a reader finds it (before any dropdown is opened)."""
    visit = _Visit(browser, site, page, LAPTOP)
    try:
        visit.page.goto(visit.url, wait_until="load")
        findings = _axe(visit.page)
    finally:
        visit.close()
    assert not findings, f"{page}.html:\n  " + "\n  ".join(findings)


# The focus ring: the outline or box shadow of the element that has the focus.
_FOCUS = r"""
() => {
  const el = document.activeElement;
  const style = getComputedStyle(el);
  const outline = style.outlineStyle !== "none" && parseFloat(style.outlineWidth) >= 1;
  const shadow = style.boxShadow && style.boxShadow !== "none";
  return {tag: el.tagName, text: (el.textContent || "").trim().slice(0, 40),
          inArticle: !!el.closest("article"), ring: outline || shadow};
}
"""


def test_keyboard_focus_is_visible(browser, site):
    # The first Tab press reaches the skip link; after a click into the text, Tab
    # reaches the next link of the article. Both must show where the focus is, in
    # light and in dark mode. One page load serves both: the mode changes the
    # colours, not what Tab reaches, so each element Tab has reached is measured in
    # the one mode, then in the other.
    visit = _Visit(browser, site, "chapters/05_gradients", LAPTOP, fresh=True)
    first, inside = {}, {}
    try:
        visit.page.goto(visit.url, wait_until="load")
        _set_mode(visit.page, "light")
        visit.page.keyboard.press("Tab")
        for mode in ("light", "dark"):
            _set_mode(visit.page, mode)
            first[mode] = visit.page.evaluate(_FOCUS)
        visit.page.locator("article.bd-article section > p").first.click()
        visit.page.keyboard.press("Tab")
        for mode in ("dark", "light"):
            _set_mode(visit.page, mode)
            inside[mode] = visit.page.evaluate(_FOCUS)
    finally:
        visit.close()
        browser.close_tab()  # the pointer stays where it clicked
    for mode in ("light", "dark"):
        assert first[mode]["ring"], (
            f"{mode}: no focus ring on the first element Tab reaches: {first[mode]}"
        )
        assert inside[mode]["inArticle"] and inside[mode]["tag"] == "A", (
            mode,
            inside[mode],
        )
        assert inside[mode]["ring"], (
            f"{mode}: no focus ring on a link of the article: {inside[mode]}"
        )


def test_figures_get_the_measured_column(browser, site):
    # test_figures.py sizes every figure's labels for a figure shown CONTENT_WIDTH_390
    # px wide on a phone (tests/book/_site_geometry.py): a narrower column would make
    # them smaller, a wider one means the constant (and the labels' sizes) are stale.
    column = CONTENT_WIDTH_390
    visit = _Visit(browser, site, "chapters/05_gradients", 390)
    try:
        visit.page.goto(visit.url, wait_until="load")
        widths = visit.page.evaluate(
            """() => [...document.querySelectorAll("article.bd-article img")]
                .filter(img => img.naturalWidth > img.getBoundingClientRect().width)
                .map(img => img.getBoundingClientRect().width)"""
        )
    finally:
        visit.close()
    assert widths, "no figure wider than the column on the page"
    assert all(abs(shown - column) <= 1 for shown in widths), (widths, column)
