"""What a page looks like at a given width: the layout checks of tools/site_check.py.

Each function takes a Playwright page, already loaded, and returns a list of
problems (empty when fine):

* `overflow`: the page is wider than the window (a reader must scroll the
  whole page sideways); names the elements that stick out.
* `broken_words`: a word of a table cell, an outline entry or a navigation
  entry is split over two lines ("re/verse", ``transpos/e()``). A line may
  break at a space, or after a hyphen, dash, slash, dot or underscore (where
  the site's jax301.js lets names in code break); anywhere else is mid-word.
  Found from the layout itself: each word's text range must lie on one line
  (``Range.getClientRects``).
* `low_contrast`: text in a cell's output whose colour is too close to the
  colour behind it (as happens when a light theme's colours meet a dark
  background), by WCAG's contrast ratio.
* `drawers`: at phone width, the menu button opens the navigation drawer and
  the outline button ("On this page") opens the page's outline, each
  visible on the screen with its words whole, and Escape closes each again.
"""
from __future__ import annotations

from pathlib import Path

# What the reader reads as entries: table cells, the page outline ("On this
# page", the secondary sidebar) and the site navigation (primary sidebar).
TABLE_CELLS = "article table th, article table td"
OUTLINE = ".bd-sidebar-secondary nav a, #pst-secondary-sidebar-modal nav a"
NAVIGATION = ".bd-sidebar-primary nav a, #pst-primary-sidebar-modal nav a"
# WCAG's minimum contrast for normal text (AA).
MIN_CONTRAST = 4.5

_OVERFLOW_JS = r"""
() => {
  const doc = document.documentElement, vw = doc.clientWidth;
  if (doc.scrollWidth <= vw + 1) return null;
  // The elements that stick out, innermost first, skipping any inside a box
  // that scrolls or clips (that box is what sticks out, if anything).
  const clipsX = el => getComputedStyle(el).overflowX !== 'visible';
  const out = [];
  for (const el of document.body.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (!r.width || r.right <= vw + 1) continue;
    let p = el.parentElement, inside = false;
    for (; p && p !== document.body; p = p.parentElement) if (clipsX(p)) { inside = true; break; }
    if (inside || getComputedStyle(el).visibility === 'hidden') continue;
    if ([...el.children].some(c => c.getBoundingClientRect().right > vw + 1)) continue;
    out.push(`<${el.tagName.toLowerCase()}> ${Math.round(r.right)} px: ` +
             JSON.stringify(el.textContent.trim().replace(/\s+/g, ' ').slice(0, 60)));
  }
  return {width: doc.scrollWidth, window: vw, culprits: out.slice(0, 3)};
}
"""

_BROKEN_WORDS_JS = r"""
(selector) => {
  // A word and the characters after which a line may break: words must not
  // be split anywhere else.
  const TOKEN = /[^\s\-\/._\u2013\u2014]+[\-\/._\u2013\u2014]*|[\-\/._\u2013\u2014]+/g;
  const found = [];
  for (const el of document.querySelectorAll(selector)) {
    if (!el.getClientRects().length) continue;  // not laid out (display: none)
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) {
      const node = walker.currentNode;
      if (node.parentElement.closest('mjx-container, script, style')) continue;
      for (const m of node.data.matchAll(TOKEN)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const rects = [...range.getClientRects()].filter(r => r.width > 0 && r.height > 0);
        if (rects.length < 2) continue;
        const top = Math.min(...rects.map(r => r.top));
        const bottom = Math.max(...rects.map(r => r.top));
        if (bottom - top > rects[0].height / 2) {
          const where = el.textContent.trim().replace(/\s+/g, ' ').slice(0, 60);
          found.push([m[0], where]);
        }
      }
    }
  }
  return found;
}
"""

_CONTRAST_JS = r"""
(minimum) => {
  const rgba = s => (s.match(/[\d.]+/g) || []).map(Number).concat([1]).slice(0, 4);
  const lum = ([r, g, b]) => {
    const c = v => (v /= 255) <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
    return 0.2126 * c(r) + 0.7152 * c(g) + 0.0722 * c(b);
  };
  const background = el => {
    for (; el; el = el.parentElement) {
      const c = rgba(getComputedStyle(el).backgroundColor);
      if (c[3] > 0.5) return c;
    }
    return [255, 255, 255, 1];
  };
  const low = [];
  const seen = new Set();
  for (const el of document.querySelectorAll('div.cell_output pre, div.cell_output pre span')) {
    if (![...el.childNodes].some(n => n.nodeType === 3 && n.data.trim())) continue;
    const fg = rgba(getComputedStyle(el).color), bg = background(el);
    const [hi, lo] = [lum(fg), lum(bg)].sort((a, b) => b - a);
    const ratio = (hi + 0.05) / (lo + 0.05);
    const key = `${fg} on ${bg}`;
    if (ratio < minimum && !seen.has(key)) {
      seen.add(key);
      low.push([ratio.toFixed(1), key, el.textContent.trim().slice(0, 40)]);
    }
  }
  return low;
}
"""


def overflow(page) -> list[str]:
  """The page is wider than its window."""
  state = page.evaluate(_OVERFLOW_JS)
  if state is None:
    return []
  return [f"page is {state['width']} px wide in a {state['window']} px window "
          f"(it scrolls sideways); sticking out: {'; '.join(state['culprits'])}"]


def broken_words(page, selector: str, what: str) -> list[str]:
  """Words of the elements ``selector`` (``what`` in messages) split over two lines."""
  return [f"{what} breaks inside a word: {word!r} in {where!r}"
          for word, where in page.evaluate(_BROKEN_WORDS_JS, selector)]


def low_contrast(page) -> list[str]:
  """Output text without enough contrast against its background."""
  return [f"output text hard to read: contrast {ratio} ({colours}) in {text!r}"
          for ratio, colours, text in page.evaluate(_CONTRAST_JS, MIN_CONTRAST)]


_DIALOG_STATE_JS = r"""
(id) => {
  const d = document.getElementById(id);
  if (!d) return null;
  const r = d.getBoundingClientRect();
  const links = d.querySelectorAll('nav a').length;
  return {open: d.open, links, left: r.left, right: r.right, width: r.width,
          window: document.documentElement.clientWidth};
}
"""

_ON_SCREEN_JS = r"""
(id) => {
  const r = document.getElementById(id).getBoundingClientRect();
  return r.left >= -1 && r.right <= document.documentElement.clientWidth + 1;
}
"""

# (the button, the dialog it opens, what a reader calls it)
DRAWERS = [
    (".primary-toggle", "pst-primary-sidebar-modal", "the navigation drawer (menu button)"),
    (".secondary-toggle", "pst-secondary-sidebar-modal", "the outline (\"On this page\")"),
]


def drawers(page, screenshot: Path | None = None) -> list[str]:
  """At phone width: each drawer opens from its visible button and closes on Escape.

  The navigation drawer is required where the page has the theme's sidebar
  (``#pst-primary-sidebar``); the outline where the page has one (a
  secondary sidebar with entries). Screenshots of each open drawer go next to
  ``screenshot`` (``-menu``, ``-outline``).
  """
  problems = []
  has = page.evaluate("""() => ({
      primary: !!document.getElementById('pst-primary-sidebar'),
      secondary: document.querySelectorAll('.bd-sidebar-secondary nav a').length > 0})""")
  for (button, dialog, what), required, suffix in zip(
      DRAWERS, (has["primary"], has["secondary"]), ("menu", "outline")):
    if not required:
      continue
    visible = page.locator(f"{button}:visible")
    if visible.count() == 0:
      problems.append(f"no visible button opens {what}")
      continue
    visible.first.click()
    try:
      page.wait_for_function(f"() => document.getElementById('{dialog}')?.open", timeout=3_000)
    except Exception:  # noqa: BLE001 - reported as a problem
      problems.append(f"the button did not open {what}")
      continue
    try:  # until it has slid in (or 2 s; then its place is reported below)
      page.wait_for_function(_ON_SCREEN_JS, arg=dialog, timeout=2_000)
    except Exception:  # noqa: BLE001 - reported with the drawer's state
      pass
    state = page.evaluate(_DIALOG_STATE_JS, dialog)
    if not state["links"]:
      problems.append(f"{what} opened empty")
    elif state["left"] < -1 or state["right"] > state["window"] + 1 or state["width"] < 100:
      problems.append(f"{what} opened off the screen ({state})")
    problems += broken_words(page, f"#{dialog} nav a", what)
    if screenshot is not None:
      page.screenshot(path=str(screenshot.with_name(f"{screenshot.stem}-{suffix}.png")))
    page.keyboard.press("Escape")
    try:
      page.wait_for_function(f"() => !document.getElementById('{dialog}').open", timeout=3_000)
    except Exception:  # noqa: BLE001 - reported as a problem
      problems.append(f"Escape did not close {what}")
  return problems
