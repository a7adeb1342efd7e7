"""What the website's layout gives a figure, measured once in the built site.

Measured on 2026-11-27 in headless Chromium (playwright, /usr/bin/chromium) on
every chapter page of ``_build/html``: at a 390 px wide viewport (a phone) each
of the 63 figures wider than the column was shown 341.97-341.98 CSS px wide, so
a figure is displayed at ``min(its natural width, CONTENT_WIDTH_390)``; a figure's
natural width is its SVG width in points times 4/3 (1 pt = 4/3 CSS px). At a
1280 px viewport the same figures were 704 CSS px wide.

tests/book/test_figures.py sizes the figures' text with these widths. The browser
test compares the real widths with them: a column narrower than measured here
would shrink every label below what test_figures computed.
"""

#: CSS px a full-width figure gets in the article at a 390 px viewport.
CONTENT_WIDTH_390 = 342
#: CSS px a full-width figure gets in the article at a 1280 px viewport.
CONTENT_WIDTH_1280 = 704
