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
  visible on the screen with its words whole, nothing in it cut off at its
  edge, and Escape closes each again; following an entry of the outline
  closes it, with the entry's section on the screen.
* `clipped`: a box (the desktop outline) whose content is wider than the
  box, so that the ends of its entries are cut off.
* `heading_breaks`: a heading that breaks inside a word or a name: a title
  wraps between words only (or after a hyphen or a dash), never after a
  name's dot or underscore.
* `summary_tables`: at phone width, the API reference's summary tables
  (Sphinx's autosummary) show each name with its description on the
  screen, without scrolling sideways, and no row lacks a description.
* `plot_text`: the text of each plot (a PNG in a cell's output) is at least
  9 px tall as shown: a figure made for a wider page is scaled down, its
  text with it. The size of a plot's text comes from the cell that drew it
  (`plot_fonts`): matplotlib's default, 10 pt at its default 100 dpi, or the
  smallest `fontsize=` the cell sets.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

# What the reader reads as entries: table cells, the page outline ("On this
# page", the secondary sidebar) and the site navigation (primary sidebar).
TABLE_CELLS = "article table th, article table td"
OUTLINE = ".bd-sidebar-secondary nav a, #pst-secondary-sidebar-modal nav a"
NAVIGATION = ".bd-sidebar-primary nav a, #pst-primary-sidebar-modal nav a"
# WCAG's minimum contrast for normal text (AA).
MIN_CONTRAST = 4.5
HEADINGS = "article h1, article h2, article h3, article h4"
# The smallest text a reader should have to read in a plot, in CSS px.
MIN_PLOT_TEXT_PX = 9.0

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


_HEADING_BREAKS_JS = r"""
(selector) => {
  // A heading's words (its code names included) wrap only at spaces, or
  // after a hyphen or a dash.
  const TOKEN = /[^\s\-\u2013\u2014]+[\-\u2013\u2014]*|[\-\u2013\u2014]+/g;
  const found = [];
  for (const el of document.querySelectorAll(selector)) {
    if (!el.getClientRects().length) continue;
    // one word may run over several text nodes (a name split into spans)
    const nodes = [];
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) {
      if (!walker.currentNode.parentElement.closest('mjx-container, a.headerlink')) {
        nodes.push(walker.currentNode);
      }
    }
    const text = nodes.map(n => n.data).join('');
    const at = i => {  // the text node and offset of character i
      for (const n of nodes) { if (i <= n.data.length) return [n, i]; i -= n.data.length; }
      return [nodes[nodes.length - 1], nodes[nodes.length - 1].data.length];
    };
    for (const m of text.matchAll(TOKEN)) {
      const range = document.createRange();
      range.setStart(...at(m.index));
      range.setEnd(...at(m.index + m[0].length));
      const rects = [...range.getClientRects()].filter(r => r.width > 0 && r.height > 0);
      if (rects.length < 2) continue;
      const tops = rects.map(r => r.top);
      if (Math.max(...tops) - Math.min(...tops) > rects[0].height / 2) {
        found.push([m[0], text.trim().replace(/\s+/g, ' ').slice(0, 60)]);
      }
    }
  }
  return found;
}
"""

_CLIPPED_JS = r"""
(selector) => {
  let scroll = 0;
  const cut = [];
  for (const box of document.querySelectorAll(selector)) {
    if (!box.getClientRects().length) continue;  // not laid out
    const r = box.getBoundingClientRect();
    scroll = Math.max(scroll, box.scrollWidth - box.clientWidth);
    for (const a of box.querySelectorAll('a')) {
      const range = document.createRange();  // the text itself, not its box
      range.selectNodeContents(a);
      const ar = range.getBoundingClientRect();
      if (ar.width && (ar.right > r.right + 1 || ar.left < r.left - 1)) {
        cut.push(a.textContent.trim().replace(/\s+/g, ' ').slice(0, 40));
      }
    }
  }
  return {scroll, cut: cut.slice(0, 3), count: cut.length};
}
"""

_SUMMARY_TABLES_JS = r"""
() => {
  const vw = document.documentElement.clientWidth, found = [];
  for (const table of document.querySelectorAll('table.autosummary')) {
    for (const row of table.rows) {
      const cells = [...row.cells];
      const name = cells[0] ? cells[0].textContent.trim() : '';
      if (cells.length > 1 && !cells[1].textContent.trim()) {
        found.push(`the row of ${name} has no description`);
      }
      for (const cell of cells) {
        const r = cell.getBoundingClientRect();
        if (r.width && (r.right > vw + 1 || r.left < -1)) {
          found.push(`the row of ${name} runs off the screen (${Math.round(r.left)} to ` +
                     `${Math.round(r.right)} px in a ${vw} px window)`);
          break;
        }
      }
    }
  }
  return found;
}
"""

_PLOTS_JS = r"""
() => [...document.querySelectorAll('div.cell_output img')]
  .filter(i => /^data:image\/png|\.png$/.test(i.getAttribute('src') || ''))
  .map(i => ({shown: i.getBoundingClientRect().width, natural: i.naturalWidth,
              src: (i.getAttribute('src') || '').slice(-40)}))
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


def heading_breaks(page, selector: str = HEADINGS) -> list[str]:
  """Headings that break inside a word or a name (a title wraps between words)."""
  return [f"a heading breaks inside a word or name: {word!r} in {where!r}"
          for word, where in page.evaluate(_HEADING_BREAKS_JS, selector)]


def clipped(page, selector: str, what: str) -> list[str]:
  """A box matching ``selector`` is narrower than its entries: their ends are
  cut off (or scroll out of sight)."""
  state = page.evaluate(_CLIPPED_JS, selector)
  if state["scroll"] <= 1 and not state["count"]:
    return []
  return [f"{what} is cut off at its edge ({state['scroll']} px wider than its box; "
          f"{state['count']} entries reach past it, e.g. {state['cut']})"]


def summary_tables(page) -> list[str]:
  """At phone width: each summary row on the screen, each with a description."""
  return [f"API summary table: {p}" for p in page.evaluate(_SUMMARY_TABLES_JS)]


# Font sizes by name, relative to matplotlib's default of 10 pt.
_NAMED_SIZES = {"xx-small": 0.579, "x-small": 0.694, "small": 0.833, "medium": 1.0,
                "large": 1.2, "x-large": 1.44, "xx-large": 1.728, "smaller": 0.833,
                "larger": 1.2}
_DEFAULT_PT, _DPI = 10.0, 100.0


def figure_font_pt(source: str) -> float | None:
  """The smallest text size, in points, that a cell's plot uses: matplotlib's
  default (10 pt) or the smallest ``fontsize=``/``labelsize=``/``size=`` the
  cell sets; None where the cell changes what the default is (rcParams, a
  style, a dpi), which the site does not follow."""
  if re.search(r"rcParams|\brc\(|style\.use|\bdpi\s*=|set_size_inches", source):
    return None
  sizes = [_DEFAULT_PT]
  for value in re.findall(r"\b(?:fontsize|labelsize|size)\s*=\s*([\w.'\"-]+)", source):
    value = value.strip("'\"")
    if value in _NAMED_SIZES:
      sizes.append(_DEFAULT_PT * _NAMED_SIZES[value])
    else:
      try:
        sizes.append(float(value))
      except ValueError:
        return None
  return min(sizes)


def plot_fonts(notebook: Path) -> list[float | None]:
  """For each PNG in a notebook's outputs, in order, `figure_font_pt` of its cell."""
  nb = json.loads(Path(notebook).read_text(encoding="utf-8"))
  fonts = []
  for cell in nb["cells"]:
    if cell["cell_type"] != "code":
      continue
    source = "".join(cell["source"])
    for out in cell.get("outputs", []):
      if "image/png" in out.get("data", {}):
        fonts.append(figure_font_pt(source))
  return fonts


def plot_text(page, fonts_pt: list[float | None]) -> list[str]:
  """Plots whose smallest text is under `MIN_PLOT_TEXT_PX` as shown."""
  plots = page.evaluate(_PLOTS_JS)
  if len(plots) != len(fonts_pt):
    return [f"{len(plots)} plots on the page, but its notebook has {len(fonts_pt)}"]
  problems = []
  for n, (plot, pt) in enumerate(zip(plots, fonts_pt), 1):
    if pt is None:
      problems.append(f"plot {n}: its cell changes matplotlib's defaults (rcParams, "
                      "style or dpi), so the size of its text is not known")
      continue
    if not plot["natural"]:
      continue  # reported as an image that did not load
    px = pt * _DPI / 72 * plot["shown"] / plot["natural"]
    if px < MIN_PLOT_TEXT_PX - 0.05:
      problems.append(
          f"plot {n} ({plot['src']}): its {pt:g} pt text is {px:.1f} px tall as shown "
          f"({plot['natural']} px wide, shown at {plot['shown']:.0f} px); at least "
          f"{MIN_PLOT_TEXT_PX:g} px needs a figure at most "
          f"{plot['shown'] * pt * _DPI / 72 / MIN_PLOT_TEXT_PX:.0f} px wide")
  return problems


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
    problems += clipped(page, f"#{dialog}", what)
    if screenshot is not None:
      page.screenshot(path=str(screenshot.with_name(f"{screenshot.stem}-{suffix}.png")))
    page.keyboard.press("Escape")
    try:
      page.wait_for_function(f"() => !document.getElementById('{dialog}').open", timeout=3_000)
    except Exception:  # noqa: BLE001 - reported as a problem
      problems.append(f"Escape did not close {what}")
    if suffix == "outline":
      problems += _follow_an_outline_entry(page, button, dialog, what)
  return problems


_TARGET_SHOWN_JS = r"""
(id) => {
  const el = document.getElementById(id);
  if (!el) return null;
  const r = el.getBoundingClientRect();
  return {top: r.top, height: innerHeight};
}
"""


def _follow_an_outline_entry(page, button, dialog, what) -> list[str]:
  """Opens the outline again and taps one of its entries further down the
  page: the drawer must close, with that entry's section on the screen."""
  page.locator(f"{button}:visible").first.click()
  try:
    page.wait_for_function(f"() => document.getElementById('{dialog}')?.open", timeout=3_000)
  except Exception:  # noqa: BLE001 - reported as a problem
    return [f"the button did not open {what} a second time"]
  links = page.locator(f"#{dialog} nav a[href^='#']")
  if links.count() == 0:
    page.keyboard.press("Escape")
    return []
  link = links.nth(min(links.count() - 1, 2))
  target = (link.get_attribute("href") or "#")[1:]
  link.click()
  try:
    page.wait_for_function(f"() => !document.getElementById('{dialog}').open", timeout=3_000)
  except Exception:  # noqa: BLE001 - reported as a problem
    page.keyboard.press("Escape")
    return [f"following an entry of {what} left the drawer open over the page"]
  page.wait_for_timeout(300)  # the scroll to the section
  shown = page.evaluate(_TARGET_SHOWN_JS, target)
  if shown is not None and not 0 <= shown["top"] < shown["height"] - 20:
    return [f"after following #{target} from {what}, its section is not on the "
            f"screen (its top at {shown['top']:.0f} px)"]
  return []
