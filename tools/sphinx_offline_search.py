"""Search excerpts on a site opened from disk (file://).

Under each result, Sphinx's search page shows an excerpt of the page around
the words searched for, which it gets by fetching that page. A browser does
not let a page opened from disk fetch another file, so there every result came
without its excerpt (and with an error in the console).

At the end of the build this writes, for each page, ``_search_text/<page>.js``:
the text of the page's main element (without the theme's bars and outline),
with its ``<section id=...>`` elements (Sphinx cuts a section's excerpt from
them), as a call
``jax301PageText(name, html)``. On the search page opened from disk,
docs/_static/jax301.js answers Sphinx's fetch of a page from that script,
which a page opened from disk may load. tests/test_site.py checks that search
shows excerpts both ways.
"""
from __future__ import annotations

import html
import html.parser
import json
import re
from pathlib import Path

OUT_DIR = "_search_text"
_SPACES = re.compile(r"\s+")
# Left out of the text: the "#" after each heading (as Sphinx's excerpts do),
# and the theme's parts of the main element (the bar with the download and
# colour buttons, the page outline, its printed copy, the previous/next links,
# the footer), which are no part of what the page says.
SKIPPED_CLASSES = {"headerlink", "bd-header-article", "bd-sidebar-secondary",
                   "onlyprint", "prev-next-footer", "bd-footer-content"}


class _MainText(html.parser.HTMLParser):
  """The text of a page's ``role="main"`` element, its sections kept (by id)."""

  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.parts: list[str] = []
    self._in_main = False
    self._skip: str | None = None  # the tag whose text is left out, while in it
    self._skip_depth = 0  # how many of that tag are open
    self._sections: list[bool] = []  # for each open <section>: whether kept

  def handle_starttag(self, tag, attrs):
    a = dict(attrs)
    if not self._in_main:
      if a.get("role") == "main":
        self._in_main = True
        self.parts.append('<div role="main">')
      return
    if self._skip:
      self._skip_depth += tag == self._skip
      return
    classes = set((a.get("class") or "").split())
    if tag in ("script", "style") or classes & SKIPPED_CLASSES:
      self._skip, self._skip_depth = tag, 1
    elif tag == "section":
      keep = "id" in a
      self._sections.append(keep)
      if keep:
        self.parts.append(f'<section id="{html.escape(a["id"])}">')

  def handle_endtag(self, tag):
    if not self._in_main:
      return
    if self._skip:
      if tag == self._skip:
        self._skip_depth -= 1
        if not self._skip_depth:
          self._skip = None
      return
    if tag == "section" and self._sections:
      if self._sections.pop():
        self.parts.append("</section>")
    elif tag == "main":
      self.parts.append("</div>")
      self._in_main = False

  def handle_data(self, data):
    if self._in_main and not self._skip:
      # Runs of white space as one space: an excerpt is one line of text.
      self.parts.append(html.escape(_SPACES.sub(" ", data), quote=False))


def main_text(page_html: str) -> str:
  """The page's main element as HTML holding only its text and sections."""
  parser = _MainText()
  parser.feed(page_html)
  parser.close()
  return "".join(parser.parts)


def write_page_texts(app, exception):
  """build-finished: ``_search_text/<page>.js`` for every HTML page built."""
  if exception is not None or app.builder.format != "html":
    return
  outdir = Path(app.outdir)
  target = outdir / OUT_DIR
  target.mkdir(exist_ok=True)
  for docname in sorted(app.env.found_docs):
    page = outdir / f"{docname}.html"
    if not page.exists():
      continue
    name = f"{docname}.html"
    text = main_text(page.read_text(encoding="utf-8"))
    script = target / f"{docname}.js"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(f"jax301PageText({json.dumps(name)}, {json.dumps(text)});\n",
                      encoding="utf-8")


def setup(app):
  """Register the build-finished hook."""
  app.connect("build-finished", write_page_texts)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
