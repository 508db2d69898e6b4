#!/usr/bin/env python
"""Check a built site the way readers see it: in headless Chromium, offline.

  python tools/site_check.py _build/html [--screenshots DIR]

Serves the site on localhost and loads every page in Debian's Chromium
(driven by Playwright, pointed at the system binary: no browser download),
with every request not addressed to localhost aborted, twice: in a 1280 px
window in light mode, and in a 390 px window (a phone) with the system set
to dark mode. For each page and width it reports:

* console errors and uncaught JavaScript exceptions;
* failed requests (aborted, refused, or HTTP status >= 400), including any
  request that tried to leave localhost;
* images that did not load (``naturalWidth`` 0);
* math that did not render: ``$``, ``\\(``, ``\\)``, ``\\[``, ``\\]`` or
  ``\\begin{`` left in text outside code, and math elements (``.math``)
  without MathJax output (``mjx-container``) inside;
* code cells without a copy button;
* a page wider than the window (tools/site_layout.py);
* a word split over two lines in a table cell, the page outline or the
  navigation (tools/site_layout.py), or a heading that breaks other than
  between words;
* output text without enough contrast against its background;
* plot text under 9 px as shown (the size of each plot's text read from the
  page's notebook, `_sources/<page>.ipynb`);

at 1280 px also:

* code blocks and tables wider than their box, which a reader must scroll
  sideways (at 390 px a table, like code, may scroll inside its own box);
* links to the same site that do not resolve (HTTP status other than 200,
  or a ``#fragment`` that names no element of the target page);
* an outline cut off at its edge;

and at 390 px: the menu button opens the navigation drawer and "On this
page" the outline, on the screen and not cut off, Escape closes each, and
following an outline entry closes the outline over its section
(site_layout.drawers); the API reference's summary tables fit the screen,
each name with its description.

`check_search` checks that the search page finds a word, and
`check_download` that a notebook page, served or opened from disk
(file://), saves its notebook from the download menu rather than showing
it. The
functions are used by tests/test_site.py, which also runs them on
deliberately broken pages. Exit status 1 if anything is wrong.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import html.parser
import http.server
import os
import shutil
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import site_layout  # noqa: E402

# Flags for headless Chromium running as root in a container, with nothing
# that phones home.
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
    "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
]
# The two widths every page is checked at: a laptop, and a phone (an iPhone
# 12 to 15 is 390 CSS px wide), the phone with the system in dark mode.
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
VIEWPORT = DESKTOP
# Pages of a Sphinx build that are not reader pages.
SKIP_DIRS = {"_static", "_sources", "_images", "_modules"}


def find_chromium() -> str | None:
  """Path of the system Chromium ($CHROMIUM, or `chromium` on PATH), or None."""
  for candidate in (os.environ.get("CHROMIUM"), shutil.which("chromium"),
                    shutil.which("chromium-browser"), "/usr/bin/chromium"):
    if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
      return candidate
  return None


def site_pages(site: Path) -> list[str]:
  """The site's HTML pages, as paths relative to ``site`` (posix)."""
  site = Path(site)
  return sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html")
                if not SKIP_DIRS & set(p.relative_to(site).parts))


# --- serving --------------------------------------------------------------------

class _QuietHandler(http.server.SimpleHTTPRequestHandler):
  def log_message(self, *args):
    pass


@contextlib.contextmanager
def serve(root):
  """Serves directory ``root`` on 127.0.0.1 (a free port); yields the base URL."""
  handler = functools.partial(_QuietHandler, directory=str(root))
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    yield f"http://127.0.0.1:{server.server_address[1]}/"
  finally:
    server.shutdown()
    server.server_close()
    thread.join()


# --- the browser ------------------------------------------------------------------

@contextlib.contextmanager
def browser(base_url: str, chromium: str | None = None, viewport: dict = DESKTOP,
            color_scheme: str = "light"):
  """A Chromium browser context in which only ``base_url``'s host is reachable.

  Yields a `Browser` whose pages have the window size ``viewport`` and the
  system colour scheme ``color_scheme``; requests to any other host are
  aborted and recorded (file:// URLs, which reach no network, load).
  """
  from playwright.sync_api import sync_playwright

  chromium = chromium or find_chromium()
  if chromium is None:
    raise RuntimeError("no Chromium found (install Debian's `chromium`)")
  origin = urlsplit(base_url).netloc
  with tempfile.TemporaryDirectory(prefix="site-check-profile-") as profile, \
       sync_playwright() as p:
    context = p.chromium.launch_persistent_context(
        profile, executable_path=chromium, headless=True, args=CHROMIUM_ARGS,
        viewport=viewport, color_scheme=color_scheme, service_workers="block",
        accept_downloads=True)
    b = Browser(context, origin, phone=viewport["width"] < 992)
    context.route("**/*", b._route)
    try:
      yield b
    finally:
      context.close()


class _IdParser(html.parser.HTMLParser):
  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.ids = set()

  def handle_starttag(self, tag, attrs):
    for k, v in attrs:
      if k == "id" or (k == "name" and tag == "a"):
        self.ids.add(v)


_PAGE_STATE_JS = r"""
async () => {
  // MathJax 3: wait for the first typeset, then for its fonts.
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    await MathJax.startup.promise;
  }
  await document.fonts.ready;
  const imgs = [...document.images];
  for (const i of imgs) i.loading = 'eager';
  await Promise.all(imgs.map(i => i.decode().catch(() => null)));
  const badImages = imgs.filter(i => !(i.complete && i.naturalWidth > 0))
                        .map(i => i.getAttribute('src'));
  const raw = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  const RAW = /\$|\\\(|\\\)|\\\[|\\\]|\\begin\{/;
  while (walker.nextNode()) {
    const n = walker.currentNode, el = n.parentElement;
    if (!el || el.closest('code, pre, kbd, samp, script, style, textarea, template, mjx-container'))
      continue;
    if (RAW.test(n.textContent)) raw.push(n.textContent.trim().slice(0, 100));
  }
  const math = [...document.querySelectorAll('.math')];
  const unrendered = math.filter(m => !m.querySelector('mjx-container'))
                         .map(m => m.textContent.trim().slice(0, 100));
  const pres = [...document.querySelectorAll('div.highlight pre')];
  const codeCells = pres.length;
  const wide = el => el.scrollWidth > el.clientWidth + 1;
  const firstLine = el => el.textContent.trim().split('\n')[0].slice(0, 80);
  const wideCode = pres.filter(wide).map(
      p => [p.scrollWidth - p.clientWidth, firstLine(p)]);
  const wideTables = [...document.querySelectorAll('table')].filter(t => {
    const box = t.closest('.pst-scrollable-table-container') || t.parentElement;
    return wide(t) || (box && wide(box));
  }).map(t => [t.scrollWidth - (t.parentElement || t).clientWidth, firstLine(t)]);
  const copyButtons = document.querySelectorAll('button.copybtn').length;
  const links = [...document.querySelectorAll('a[href]')].map(a => a.href)
                  .filter(h => h.startsWith(location.origin + '/'));
  return {badImages, raw, mathCount: math.length, unrendered,
          mjx: document.querySelectorAll('mjx-container').length,
          codeCells, copyButtons, links, wideCode, wideTables};
}
"""


# [page results of the search page without an excerpt, page results].
_EXCERPTS_JS = """() => {
  const pages = [...document.querySelectorAll(
      '#search-results li.kind-text, #search-results li.kind-title')];
  return [pages.filter(li => !li.querySelector('p.context')).length, pages.length];
}"""


class Browser:
  """Loads pages in one browser context and reports what is wrong with them."""

  def __init__(self, context, origin, phone=False):
    self.context = context
    self.origin = origin
    self.phone = phone  # narrower than the theme's sidebars: drawers instead
    self.blocked = []
    self._link_cache = {}  # url without fragment -> (status, ids or None)

  def _route(self, route):
    url = route.request.url
    parts = urlsplit(url)
    if parts.scheme in ("data", "blob", "file") or parts.netloc == self.origin:
      route.continue_()
    else:
      self.blocked.append(url)
      route.abort("blockedbyclient")

  def check_page(self, url: str, screenshot: Path | None = None,
                 plot_fonts: list | None = None) -> list[str]:
    """Loads ``url``; returns a list of problems (empty if the page is fine).

    ``plot_fonts``: the smallest text size, in points, of each plot on the
    page (site_layout.plot_fonts); None checks no plot's text.
    """
    page = self.context.new_page()
    problems = []
    page.on("console", lambda m: m.type == "error" and problems.append(
        f"console error: {m.text[:300]}"))
    page.on("pageerror", lambda e: problems.append(f"JavaScript exception: {e}"))
    page.on("requestfailed", lambda r: problems.append(
        f"request failed: {r.url} ({r.failure})"))
    page.on("response", lambda r: r.status >= 400 and problems.append(
        f"HTTP {r.status}: {r.url}"))
    try:
      response = page.goto(url, wait_until="load", timeout=30_000)
      if response is None or response.status != 200:
        problems.append(f"page itself: HTTP {response and response.status}")
      state = page.evaluate(_PAGE_STATE_JS)
      if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(screenshot))
      problems += self._layout(page, screenshot)
      if plot_fonts is not None:
        problems += site_layout.plot_text(page, plot_fonts)
    except Exception as e:  # noqa: BLE001 - a page that cannot load is a problem
      return problems + [f"could not load or inspect the page: {e}"]
    finally:
      page.close()
    problems += [f"image did not load: {src}" for src in state["badImages"]]
    problems += [f"raw math in text: {t!r}" for t in state["raw"]]
    problems += [f"math not rendered by MathJax: {t!r}" for t in state["unrendered"]]
    if state["mathCount"] and not state["mjx"]:
      problems.append("page has math but no MathJax output (mjx-container)")
    if state["codeCells"] and state["copyButtons"] < state["codeCells"]:
      problems.append(f"{state['codeCells']} code blocks but "
                      f"{state['copyButtons']} copy buttons")
    if self.phone:  # code and wide tables scroll in their own box on a phone
      return problems
    problems += [f"code block scrolls sideways ({px} px too wide): {line!r}"
                 for px, line in state["wideCode"]]
    problems += [f"table scrolls sideways ({px} px too wide): {line!r}"
                 for px, line in state["wideTables"]]
    for link in sorted(set(state["links"])):
      problem = self.check_link(link)
      if problem:
        problems.append(problem)
    return problems

  def _layout(self, page, screenshot):
    """The checks of tools/site_layout.py at this window's width."""
    problems = site_layout.overflow(page)
    problems += site_layout.broken_words(page, site_layout.TABLE_CELLS, "a table cell")
    problems += site_layout.low_contrast(page)
    problems += site_layout.heading_breaks(page)
    if self.phone:  # the sidebars are drawers, checked open
      problems += site_layout.summary_tables(page)
      problems += site_layout.drawers(page, screenshot)
    else:
      problems += site_layout.broken_words(page, site_layout.OUTLINE, "the outline")
      problems += site_layout.broken_words(page, site_layout.NAVIGATION, "the navigation")
      problems += site_layout.clipped(page, ".bd-sidebar-secondary",
                                      "the outline (\"On this page\")")
    return problems

  def _fetch(self, url):
    if url not in self._link_cache:
      try:
        with urllib.request.urlopen(url, timeout=10) as r:
          status, body = r.status, r.read()
          ctype = r.headers.get_content_type()
      except urllib.error.HTTPError as e:
        status, body, ctype = e.code, b"", ""
      except OSError as e:
        status, body, ctype = f"error {e}", b"", ""
      ids = None
      if ctype == "text/html":
        parser = _IdParser()
        parser.feed(body.decode("utf-8", "replace"))
        ids = parser.ids
      self._link_cache[url] = (status, ids)
    return self._link_cache[url]

  def check_link(self, link: str) -> str | None:
    """A problem with a same-site link, or None if it resolves."""
    url, fragment = urldefrag(link)
    status, ids = self._fetch(url)
    if status != 200:
      return f"broken link: {link} (HTTP {status})"
    fragment = unquote(fragment)
    if fragment and ids is not None and fragment not in ids:
      return f"broken link: {link} (no element with id {fragment!r})"
    return None

  def check_search(self, search_url: str, word: str,
                   screenshot: Path | None = None) -> list[str]:
    """Searches for ``word`` on the Sphinx search page; problems if nothing is found."""
    page = self.context.new_page()
    problems = []
    page.on("console", lambda m: m.type == "error" and problems.append(
        f"console error: {m.text[:300]}"))
    page.on("pageerror", lambda e: problems.append(f"JavaScript exception: {e}"))
    try:
      page.goto(f"{search_url}?q={word}", wait_until="load", timeout=30_000)
      try:
        page.wait_for_function(
            "() => { const s = document.querySelector('#search-results');"
            " return s && /found|did not match/i.test(s.textContent) }",
            timeout=30_000)
      except Exception as e:  # noqa: BLE001 - reported as a problem
        problems.append(f"search for {word!r} did not finish: {e}")
        return problems
      hits = page.eval_on_selector_all(
          "#search-results ul.search li", "els => els.map(e => e.textContent)")
      if not hits:
        problems.append(f"search for {word!r} found nothing")
      elif not any(word in h for h in hits):
        problems.append(f"search for {word!r}: no result mentions it: {hits[:3]}")
      # A result that is a page or a section (not an API entry, which shows
      # its description) gets an excerpt of the page around the word.
      try:
        page.wait_for_function(f"() => ({_EXCERPTS_JS})()[0] === 0", timeout=10_000)
      except Exception:  # noqa: BLE001 - reported as a problem
        missing, total = page.evaluate(_EXCERPTS_JS)
        problems.append(f"search for {word!r}: {missing} of {total} page results "
                        "show no excerpt")
      if screenshot is not None:
        screenshot.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(screenshot))
    finally:
      page.close()
    return problems


def check_download(page_url: str, chromium=None) -> tuple[list[str], bytes | None]:
  """Opens the page at ``page_url`` and picks its notebook in the download menu.

  Returns (problems, the saved file's bytes or None). Works for a served
  site and for one opened from disk (a file:// URL), where a browser shows a
  .ipynb link as text unless the site's own script saves it
  (docs/_static/jax301.js).
  """
  from playwright.sync_api import TimeoutError as PlaywrightTimeout

  page = page_url.rsplit("/", 1)[-1]
  name = page.removesuffix(".html") + ".ipynb"
  base = page_url if page_url.startswith("file:") else page_url.rsplit("/", 1)[0] + "/"
  problems = []
  with browser(base, chromium) as b:
    tab = b.context.new_page()
    tab.on("pageerror", lambda e: problems.append(f"JavaScript exception: {e}"))
    tab.goto(page_url, wait_until="load", timeout=30_000)
    link = tab.locator(f'.dropdown-download-buttons a[href$="_sources/{name}"]')
    if link.count() != 1:
      return [f"{page}: no download menu item for {name}"], None
    tab.locator(".dropdown-download-buttons button.dropdown-toggle").click()
    try:
      with tab.expect_download(timeout=10_000) as info:
        link.click()
    except PlaywrightTimeout:
      shown = [p.url for p in b.context.pages if p.url.endswith(name)]
      return problems + [f"{page_url}: the {name} menu item did not save the file "
                         f"(shown instead: {shown})"], None
    download = info.value
    if download.suggested_filename != name:
      problems.append(f"saved as {download.suggested_filename!r}, not {name!r}")
    with open(download.path(), "rb") as f:
      return problems, f.read()


def check_site(site, screenshots=None, search_word="HiPrim", chromium=None):
  """Checks every page of ``site`` at both widths; returns ``{page: [problems]}``.

  Only pages with problems are in the result; a problem seen at the phone
  width is marked ``[390 px]``. Screenshots: ``<page>.png`` at 1280 px,
  ``<page>-390.png`` (and ``-390-menu``, ``-390-outline`` with a drawer
  open) at 390 px. The two widths are checked at once, each in a browser of
  its own (most of the time is the browser loading and laying out pages).
  """
  site = Path(site)
  passes = [(DESKTOP, "light", "", ""), (PHONE, "dark", f"-{PHONE['width']}",
                                           f"[{PHONE['width']} px] ")]

  def one_pass(base, viewport, scheme, suffix, mark):
    found = []  # (page, problem)
    with browser(base, chromium, viewport, scheme) as b:
      for rel in site_pages(site):
        shot = Path(screenshots) / (rel.removesuffix(".html").replace("/", "__")
                                    + suffix + ".png") if screenshots else None
        notebook = site / "_sources" / (rel.removesuffix(".html") + ".ipynb")
        fonts = site_layout.plot_fonts(notebook) if notebook.is_file() else None
        found += [(rel, mark + p) for p in b.check_page(base + rel, shot, fonts)]
      if (site / "search.html").exists() and search_word:
        shot = Path(screenshots) / f"search-results{suffix}.png" if screenshots else None
        found += [("search.html?q=" + search_word, mark + p)
                  for p in b.check_search(base + "search.html", search_word, shot)]
      found += [("(network)", f"blocked request to {u}") for u in sorted(set(b.blocked))]
    return found

  report = {}
  with serve(site) as base, concurrent.futures.ThreadPoolExecutor(len(passes)) as pool:
    # Playwright's synchronous API: one instance per thread, none shared.
    for found in pool.map(lambda args: one_pass(base, *args), passes):
      for page, problem in found:
        report.setdefault(page, []).append(problem)
  return report


def main(argv=None):
  import argparse
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("site")
  ap.add_argument("--screenshots", default=None)
  args = ap.parse_args(argv)
  report = check_site(args.site, args.screenshots)
  for page, problems in report.items():
    print(page)
    for p in problems:
      print("  " + p)
  n = len(site_pages(args.site))
  if report:
    sys.exit(f"{sum(map(len, report.values()))} problem(s) on {len(report)} page(s)")
  print(f"site check: {n} pages fine in Chromium (offline)")


if __name__ == "__main__":
  main()
