"""The whole book as one PDF, printed by headless Chromium: ``make pdf``.

Jupyter Book's single-page HTML (``jupyter-book build . --builder singlehtml``)
holds every page of the book, figures and math included. This script serves it
on 127.0.0.1, opens it in Debian's Chromium through Playwright, waits until
MathJax has typeset every formula, puts a table of contents (the chapter and
section headings, as links) at the front, and prints the page to PDF with a
document outline, so a PDF reader shows the chapters as bookmarks too. No TeX is
needed.

Usage::

    python tools/pdf.py [--html _build/singlehtml] [--out _build/pdf/book.pdf]
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")

# A table of contents from the headings of the printed page: the book's title, its
# pages (h2) and their sections (h3), as links to their anchors.
_ADD_CONTENTS = """
() => {
  const main = document.querySelector('main') || document.body;
  const heads = [...main.querySelectorAll('section > h1, section > h2, section > h3')];
  const nav = document.createElement('nav');
  nav.id = 'pdf-contents';
  nav.innerHTML = '<h1>Contents</h1>';
  const list = document.createElement('ul');
  for (const h of heads) {
    const section = h.closest('section');
    if (!section || !section.id) continue;
    const item = document.createElement('li');
    item.className = h.tagName.toLowerCase();
    const link = document.createElement('a');
    link.href = '#' + section.id;
    link.textContent = h.textContent.replace(/#$/, '').trim();
    item.appendChild(link);
    list.appendChild(item);
  }
  nav.appendChild(list);
  main.prepend(nav);
  return heads.length;
}
"""

_PRINT_CSS = """
@media print {
  .bd-header, .bd-sidebar-primary, .bd-sidebar-secondary, .header-article,
  .prev-next-area, .bd-footer, .bd-footer-article, .headerlink,
  .sidebar-toggle, .article-header-buttons { display: none !important; }
  .bd-main, .bd-content, .bd-article-container, .bd-page-width {
    max-width: 100% !important; width: 100% !important; }
  #pdf-contents { break-after: page; }
  #pdf-contents ul { list-style: none; padding-left: 0; }
  #pdf-contents li { margin: 0.15em 0; }
  #pdf-contents li a { text-decoration: none; font-weight: normal; }
  #pdf-contents li.h2 { margin-top: 0.6em; font-weight: bold; }
  #pdf-contents li.h3 { padding-left: 1.5em; font-size: 0.9em; }
  section > h1 { break-before: page; }
  .cell_output img, figure img { max-width: 100% !important; }
  pre { white-space: pre-wrap !important; }
}
"""


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


def print_book(html: Path, out: Path) -> int:
    """Print the single-page book in ``html`` to ``out``; return the headings listed."""
    from playwright.sync_api import sync_playwright

    # Jupyter Book writes the book to chapters/index.html (the root document) with
    # links relative to the build folder, and a redirect at index.html: the page is
    # served from the folder's top, where its links resolve.
    source = html / "chapters" / "index.html"
    if not source.exists():
        raise SystemExit(f"{source} not found: build the single-page HTML first")
    (html / "book.html").write_text(
        source.read_text(encoding="utf-8"), encoding="utf-8"
    )
    handler = functools.partial(_Quiet, directory=str(html))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
            )
            page = browser.new_page(viewport={"width": 1100, "height": 1400})
            page.goto(
                f"http://127.0.0.1:{server.server_address[1]}/book.html",
                wait_until="load",
                timeout=300_000,
            )
            # MathJax typesets after load; wait until it has finished.
            page.wait_for_function(
                "window.MathJax && MathJax.startup && MathJax.startup.promise"
                " ? MathJax.startup.promise.then(() => true) : true",
                timeout=300_000,
            )
            page.add_style_tag(content=_PRINT_CSS)
            headings = page.evaluate(_ADD_CONTENTS)
            out.parent.mkdir(parents=True, exist_ok=True)
            page.pdf(
                path=str(out),
                format="A4",
                print_background=True,
                margin={
                    "top": "15mm",
                    "bottom": "15mm",
                    "left": "12mm",
                    "right": "12mm",
                },
                outline=True,
                tagged=True,
            )
            browser.close()
    finally:
        server.shutdown()
        server.server_close()
    return headings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--html", type=Path, default=ROOT / "_build" / "singlehtml")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "_build" / "pdf" / "book.pdf"
    )
    args = parser.parse_args(argv)
    headings = print_book(args.html, args.out)
    if headings < 10 or not args.out.exists():
        print(f"the PDF lists {headings} headings: the book did not print whole")
        return 1
    size = args.out.stat().st_size / 2**20
    print(f"{args.out}: {size:.1f} MiB, {headings} headings in its contents")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
