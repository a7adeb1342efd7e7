/* Softmax in Attention: accessible names the theme leaves out or gets wrong
   (WCAG 2.1 AA, as axe-core checks it; tests/book/test_site.py runs axe-core on every
   page, in light and dark mode).

   1. A control's accessible name contains the words it shows (WCAG 2.5.3, "label in
      name"): the search button shows "Search Ctrl+K" and the toggle of a hidden code
      cell "Show code cell source", but both carried another aria-label ("Search",
      "Toggle hidden content"). Where the label leaves out the visible text, it is
      dropped, so the name is what the reader sees.
   2. Every toggle has a name (WCAG 4.1.2): the sidebar's arrows that open a chapter's
      list of pages are <summary> elements with only an icon; each is named after its
      chapter ("Pages of 5. Gradients of softmax").

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
    // 2. Icon-only toggles of the sidebar.
    document.querySelectorAll("nav summary").forEach(function (summary) {
      if (visibleText(summary) || summary.hasAttribute("aria-label")) return;
      const details = summary.parentElement;
      const item = details && details.parentElement;
      const link = item && item.querySelector(":scope > a");
      const label = link ? visibleText(link) : "";
      summary.setAttribute("aria-label", label ? "Pages of " + label : "More pages");
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", nameControls);
  } else {
    nameControls();
  }
})();
