"""Schematics drawn by code: one module per idea, one look for all of them.

Every diagram is a function ``draw_<what>(...) -> Figure`` that takes the
library's own values where the library has them (a mask from
``softmaxbook.causal_mask``, block sizes from ``softmaxbook.attention.flash``), so a
diagram cannot drift from the code it explains. The shared primitives (boxes,
arrows, grids of cells) live in :mod:`bookkit.diagrams._draw`.

Modules are imported by name (``from bookkit.diagrams import pipeline``), so a
page that draws one diagram does not import the others.
"""
