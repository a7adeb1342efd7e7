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
"""
from __future__ import annotations

import importlib
import sys

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


def setup(app):
    app.set_html_assets_policy("always")
    app.connect("missing-reference", _resolve)
    app.connect("html-page-context", _unique_scripts, priority=900)  # after the others
    return {"parallel_read_safe": True, "parallel_write_safe": True}
