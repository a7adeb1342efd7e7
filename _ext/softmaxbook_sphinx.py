"""The book's own Sphinx extension: three small fixes jupyter-book 1 needs.

1. Links to ``softmaxbook.<name>`` resolve. The API page documents each
public name in the module that defines it (``softmaxbook.masking.causal_mask``),
so the page is grouped by module. The
docstrings and chapters link to names as readers use them, through the package
(``:func:`~softmaxbook.causal_mask```, or ``:func:`softmax``` from inside
another module). When Sphinx finds no such target, this looks the name up in
the ``__all__`` of the submodules and links to the module-level entry, so no
list of names has to be kept by hand.

2. No inline script twice. Sphinx 7.4 registers an inline ``<script>`` added
while reading (sphinx-thebe's ``const THEBE_JS_URL = ...``) a second time
when it starts writing, and a ``const`` declared twice is a JavaScript error
on every page. Each page gets the list with duplicates removed.

3. MathJax on every page. Sphinx loads it only on pages with formulas in their
text, but a chapter title with math (``Scaling by $\\sqrt{d_k}$``) is shown on
every page, in the navigation.

4. The claims ledger. ``:::{claims-ledger}`` expands, at build time, into every
claim the chapters check, page by page in the order of ``_toc.yml``, read from
the verification cells of the notebooks by :func:`bookkit.claims.page_claims`.
A claim is written once, in the cell that checks it.

5. Stability marks. An entry of the API page whose name ``softmaxbook.API_STABILITY``
marks experimental opens with a line that says so; the mark is declared once, in
``softmaxbook/__init__.py``.

6. The single-page HTML of ``make pdf``. Sphinx looks up a node's HTML
visitors by the builder's name, and extensions register them for ``html``
only (myst-nb's hidden-code toggles), so ``singlehtml`` gets the same ones.

7. Build time, the pages unchanged. pybtex looks each style plugin up in the
installed packages' entry points, and sphinxcontrib-bibtex asks for one at every
citation (a scan of all installed distributions each time): a plugin, once found,
is kept. Sphinx unpickles a whole page at each ``{numref}`` to it (the API page,
megabytes, several times): while the pages are written, nothing changes the
pickled pages, so a page read for a ``{numref}`` is unpickled once and kept.
"""
from __future__ import annotations

import functools
import importlib
import re
import sys
import weakref
from pathlib import Path

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

PACKAGE = "softmaxbook"


def _canonical(target: str) -> str | None:
    """``softmaxbook.causal_mask[.attr]`` -> ``softmaxbook.masking.causal_mask[.attr]``."""
    if not target.startswith(PACKAGE + "."):
        return None
    head, _, rest = target[len(PACKAGE) + 1:].partition(".")
    try:
        package = importlib.import_module(PACKAGE)
    except Exception:  # autodoc has already reported why the package does not import
        return None
    if head not in getattr(package, "__all__", ()):
        return None
    public = getattr(package, head)
    for name in sorted(sys.modules):
        module = sys.modules[name]
        # The module whose __all__ exports this very object (softmaxbook.reference
        # also exports a ``softmax``, but a different one).
        if (name.startswith(PACKAGE + ".") and head in getattr(module, "__all__", ())
                and getattr(module, head, None) is public):
            return ".".join(filter(None, [name, head, rest]))
    return None


def _resolve(app, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"]
    candidates = [target]
    if (node.get("py:module") or "").startswith(PACKAGE) and not target.startswith(PACKAGE + "."):
        candidates.append(f"{PACKAGE}.{target}")  # `softmax` written inside softmaxbook.online
    domain = env.get_domain("py")
    for candidate in candidates:
        canonical = _canonical(candidate)
        if canonical and canonical in domain.objects:
            return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"],
                                       canonical, node, contnode)
    return None


def _unique_scripts(app, pagename, templatename, context, doctree):
    if not context.get("script_files"):
        return
    scripts, seen = [], set()
    for script in context["script_files"]:
        attributes = getattr(script, "attributes", {})
        key = (getattr(script, "filename", script) or "", tuple(sorted(attributes.items())))
        if key not in seen:
            seen.add(key)
            scripts.append(script)
    # In place: this is the builder's list, which it restores after each page.
    context["script_files"][:] = scripts


def _toc_pages(srcdir: Path) -> list[str]:
    """The chapter pages of _toc.yml, in reading order."""
    toc = (srcdir / "_toc.yml").read_text(encoding="utf-8")
    entries = re.findall(r"file:\s*(\S+)", toc)
    return [e for e in entries if re.match(r"chapters/(0[1-9]|10)_", e)]


class ClaimsLedger(SphinxDirective):
    """Every checked claim of the chapters, page by page (see module docstring, 4)."""

    has_content = False

    def run(self):
        from bookkit.claims import page_claims

        srcdir = Path(self.env.srcdir)
        lines: list[str] = []
        summary = ["| Page | Claims |", "| --- | ---: |"]
        total = 0
        ledger = []
        for page in _toc_pages(srcdir):
            notebook = srcdir / f"{page}.ipynb"
            if not notebook.exists():
                continue
            self.env.note_dependency(str(notebook))
            claims = page_claims(notebook, srcdir)
            if not claims:
                continue
            total += len(claims)
            ledger.append((page, claims))
            summary.append(f"| {page} | {len(claims)} |")
            lines += ["", f"**{page}**", ""]
            lines += [f"- {claim.text}" for claim in claims]
        summary.append(f"| **All pages** | **{total}** |")
        table = self.parse_text_to_nodes("\n".join(summary))
        body = self.parse_text_to_nodes("\n".join(lines))
        # The page names become links showing the page's own title (its math
        # typeset), and each claim a link to the text on its page that makes it.
        rows = [row for node in table for row in node.findall(nodes.row)][1:]
        for row, (page, _) in zip(rows, ledger):
            _link_page(row.next_node(nodes.paragraph), page)
        titles = [node for node in body if isinstance(node, nodes.paragraph)]
        lists = [node for node in body if isinstance(node, nodes.bullet_list)]
        for title, items, (page, claims) in zip(titles, lists, ledger):
            _link_page(title.next_node(nodes.strong), page)
            for item, claim in zip(items.children, claims):
                paragraph = item.next_node(nodes.paragraph)
                link = _LedgerLink("", "", internal=True, refuri="",
                                   ledger_doc=page, ledger_anchor=claim.anchor)
                link += paragraph.children
                paragraph.children = []
                paragraph += link
        return table + body

    def parse_text_to_nodes(self, text: str):
        holder = nodes.container()
        self.state.nested_parse(StringList(text.split("\n")), self.content_offset, holder)
        return holder.children


class _LedgerLink(nodes.reference):
    """A link of the ledger, its address filled in when the pages are written."""


def _link_page(node, page: str) -> None:
    """Turn ``node``'s text (a page name) into a link showing the page's title."""
    link = _LedgerLink("", "", internal=True, refuri="", ledger_doc=page,
                       ledger_anchor="", ledger_title=True)
    link += nodes.Text(page)
    node.children = []
    node += link


def _resolve_ledger(app, doctree, docname):
    """Address of each ledger link, and the linked page's title (its math as math)."""
    for link in list(doctree.findall(_LedgerLink)):
        page, anchor = link["ledger_doc"], link["ledger_anchor"]
        if app.builder.name == "singlehtml":
            uri = "#" + (anchor or f"document-{page}")
        else:
            uri = app.builder.get_relative_uri(docname, page)
            uri += f"#{anchor}" if anchor else ""
        if link.get("ledger_title") and page in app.env.titles:
            title = app.env.titles[page].deepcopy()
            number = app.env.toc_secnumbers.get(page, {}).get("")
            link.children = []
            if number:  # "5.1. ", as the sidebar shows it
                link += nodes.Text(".".join(map(str, number)) + ". ")
            link += title.children
        reference = nodes.reference("", "", *link.children, internal=True, refuri=uri)
        link.replace_self(reference)


def _stability(app, what, name, obj, options, lines):
    """Open an experimental name's entry with the mark ``sb.API_STABILITY`` gives it."""
    try:
        package = importlib.import_module(PACKAGE)
    except Exception:  # autodoc has already reported why the package does not import
        return
    short = name.rpartition(".")[2]
    stability = getattr(package, "API_STABILITY", {}).get(short)
    if stability == "experimental" and getattr(package, short, None) is obj:
        lines[:0] = [
            "*Experimental:* its signature or behaviour may still change in a minor "
            "version.",
            "",
        ]


def _share_html_visitors(app):
    if app.builder.name in ("singlehtml", "dirhtml"):
        handlers = app.registry.translation_handlers
        for node, visitors in handlers.get("html", {}).items():
            handlers.setdefault(app.builder.name, {}).setdefault(node, visitors)


def _keep_pybtex_plugins() -> None:
    import pybtex.plugin

    load = pybtex.plugin._load_entry_point
    if not hasattr(load, "cache_info"):  # not twice, when Sphinx runs again in-process
        pybtex.plugin._load_entry_point = functools.cache(load)


# The pages a build's ``{numref}`` resolution has unpickled, for each environment.
_NUMREF_PAGES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _NumrefDoctrees:
    """The environment, for StandardDomain's ``{numref}`` resolution, with each page
    it looks a target up in unpickled once (it only reads the page)."""

    def __init__(self, env) -> None:
        self._env = env
        self._pages = _NUMREF_PAGES.setdefault(env, {})

    def __getattr__(self, name):
        return getattr(self._env, name)

    def get_doctree(self, docname: str):
        if docname not in self._pages:
            self._pages[docname] = self._env.get_doctree(docname)
        return self._pages[docname]


def _keep_numref_doctrees() -> None:
    from sphinx.domains.std import StandardDomain

    resolve = StandardDomain._resolve_numref_xref
    if getattr(resolve, "keeps_doctrees", False):  # not twice in one process
        return

    def _resolve_numref_xref(self, env, *args, **kwargs):
        return resolve(self, _NumrefDoctrees(env), *args, **kwargs)

    _resolve_numref_xref.keeps_doctrees = True
    StandardDomain._resolve_numref_xref = _resolve_numref_xref


def _forget_numref_doctrees(app, env) -> None:
    """Pages are pickled as they are read: those kept are of the reading just done."""
    _NUMREF_PAGES.pop(env, None)


def setup(app):
    _keep_pybtex_plugins()
    _keep_numref_doctrees()
    app.connect("env-updated", _forget_numref_doctrees)
    app.connect("builder-inited", _share_html_visitors)
    app.add_directive("claims-ledger", ClaimsLedger)
    app.add_node(_LedgerLink)
    app.connect("doctree-resolved", _resolve_ledger)
    app.set_html_assets_policy("always")
    app.connect("missing-reference", _resolve)
    app.connect("autodoc-process-docstring", _stability)
    app.connect("html-page-context", _unique_scripts, priority=900)  # after the others
    return {"parallel_read_safe": True, "parallel_write_safe": True}
