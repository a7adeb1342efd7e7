/* Softmax in Attention: accessible names the theme leaves out or gets wrong
   (WCAG 2.1 AA, as axe-core checks it; tests/book/test_site.py runs axe-core on every
   page, in light and dark mode).

   1. A control's accessible name contains the words it shows (WCAG 2.5.3, "label in
      name"): the search button shows "Search Ctrl+K" and the toggle of a hidden code
      cell "Show code cell source", but both carried another aria-label ("Search",
      "Toggle hidden content"). Where the label leaves out the visible text, it is
      dropped, so the name is what the reader sees.
      An icon inside such a control (the colour-mode button's sun and moon) is
      hidden from assistive technology: the control's label names it.
   2. Every toggle has a name (WCAG 4.1.2): the sidebar's arrows that open a chapter's
      list of pages are <summary> elements with only an icon; each is named after its
      chapter ("Pages of 5. Gradients of softmax").
   3. Lists hold list items (WCAG 1.3.1): the bibliography's entries are given the
      role listitem that their role="list" container requires.

   The script only adds or removes attributes; it loads with every page (Jupyter Book
   adds each file of _static/) and runs once the page is parsed. */
(function () {
  "use strict";

  // The text a reader sees in an element, with inline TeX (\(...\)) made readable.
  function visibleText(element) {
    return (element.innerText || element.textContent || "")
      .replace(/\\\(|\\\)/g, "")
      .replace(/\\sqrt\{([^{}]*)\}/g, "\u221a$1")
      .replace(/\\([A-Za-z]+)/g, "$1")
      .replace(/[{}]/g, "")
      .replace(/\s+/g, " ")
      .trim();
  }

  function squash(text) {
    return text.toLowerCase().replace(/[^\p{L}\p{N}]+/gu, "");
  }

  function nameControls() {
    // 1. Labels that hide the visible text.
    document
      .querySelectorAll("button[aria-label], summary[aria-label], a[aria-label]")
      .forEach(function (control) {
        const shown = squash(visibleText(control));
        if (shown && !squash(control.getAttribute("aria-label")).includes(shown)) {
          control.removeAttribute("aria-label");
        }
      });
    // An icon inside a named control is decoration: Font Awesome draws it as an
    // <svg role="img"> with a <title> ("Light", "Dark"), which would be visible text
    // that the control's name ("Color mode") does not contain.
    // Before Font Awesome draws it, the icon's title goes; if it has drawn it already,
    // the <svg>'s.
    document
      .querySelectorAll("button[aria-label] i[title], a[aria-label] i[title]")
      .forEach(function (icon) {
        icon.removeAttribute("title");
      });
    document
      .querySelectorAll("button[aria-label] svg, a[aria-label] svg")
      .forEach(function (icon) {
        icon.querySelectorAll("title").forEach(function (title) {
          title.remove();
        });
        icon.removeAttribute("aria-labelledby");
        icon.removeAttribute("role");
        icon.setAttribute("aria-hidden", "true");
      });
    // 2. Icon-only toggles of the sidebar.
    document.querySelectorAll("nav summary").forEach(function (summary) {
      if (visibleText(summary) || summary.hasAttribute("aria-label")) return;
      const details = summary.parentElement;
      const item = details && details.parentElement;
      const link = item && item.querySelector(":scope > a");
      const label = link ? visibleText(link) : "";
      summary.setAttribute("aria-label", label ? "Pages of " + label : "More pages");
    });
    // 3. The bibliography: docutils writes a role="list" whose entries have the role
    // doc-biblioentry, which a list may not hold (WCAG 1.3.1): they are its items.
    document
      .querySelectorAll('[role="list"] > [role="doc-biblioentry"]')
      .forEach(function (entry) {
        entry.setAttribute("role", "listitem");
      });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", nameControls);
  } else {
    nameControls();
  }
  // Font Awesome turns its <i> icons into <svg> as the page loads: once more then.
  window.addEventListener("load", nameControls);
})();
