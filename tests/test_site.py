"""The built site in a real browser: headless Chromium, offline.

Checks _build/html (built by `nox -s docs`; `nox -s ci` runs this test, the
`site` session, once `docs` has ended) with tools/site_check.py, every page
at 1280 px (light mode) and at 390 px (a phone, in dark mode): loaded with
the network blocked except localhost, with no console errors or failed
requests, every image loaded, all math rendered by MathJax, a copy button on
every code block, no page wider than the window, no word split over two lines
in a table cell, the outline or the navigation, no heading broken other than
between words, readable output text, plot text at least 9 px tall as shown;
at 1280 px every same-site link resolving, no code block or table scrolling
sideways and the outline not cut off; at 390 px the navigation drawer and
the outline opening from their buttons, not cut off, and closing on Escape,
the outline closing when one of its entries is followed, and the API
summary tables fitting the screen with a description in every row. The search page finds `HiPrim`; each page's
notebook download is a notebook with its hidden cells marked, and is saved
(not shown) from the served site and from the site opened from disk. A
screenshot of each page at each width goes to _build/screenshots/.
Deliberately broken pages check the checker.

Needs Playwright (the `site` extra; the `site` nox session installs it) and
Debian's Chromium (`apt-get install chromium`; the `site` and `ci` nox
sessions install it when run as root). Without them, or without a built
site, the tests are skipped with the reason, unless HIJAX_SITE_TEST=required
(set by the `site` nox session under CI), in which case they fail.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SITE = Path(os.environ.get("HIJAX_SITE", ROOT / "_build" / "html"))  # the built site
SCREENSHOTS = ROOT / "_build" / "screenshots"
sys.path.insert(0, str(ROOT / "tools"))
import site_check  # noqa: E402

REQUIRED = os.environ.get("HIJAX_SITE_TEST") == "required"


def _unavailable(reason):
  if REQUIRED:
    pytest.fail(f"HIJAX_SITE_TEST=required, but {reason}")
  pytest.skip(reason)


@pytest.fixture(scope="module")
def chromium():
  try:
    import playwright.sync_api  # noqa: F401
  except ImportError:
    _unavailable("Playwright is not installed (pip install '.[site]'; the "
                 "`site` nox session installs it)")
  path = site_check.find_chromium()
  if path is None:
    _unavailable("no Chromium binary (Debian: apt-get install chromium; the "
                 "`site` nox session installs it when run as root)")
  return path


@pytest.fixture(scope="module")
def site():
  if not (SITE / "index.html").exists():
    _unavailable(f"no built site at {SITE}: run `nox -s docs` first")
  return SITE


def _conf_list(name):
  ns = {}
  src = (ROOT / "conf.py").read_text(encoding="utf-8")
  # Only the literal page lists, not the whole Sphinx configuration.
  start = src.index(f"{name} = [")
  exec(src[start:src.index("]", start) + 1], ns)  # noqa: S102
  return ns[name]


def _all_pages():
  return (_conf_list("PAGES") + _conf_list("APPENDIX") + _conf_list("BEYOND")
          + _conf_list("REFERENCE") + _conf_list("SUBPAGES"))


def _load_tool(name):
  spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _is_notebook(md):
  """A MyST notebook page (jupytext header with a kernelspec), not plain MyST."""
  text = md.read_text(encoding="utf-8") if md.exists() else ""
  return text.startswith("---") and "kernelspec:" in text.split("\n---", 1)[0]


# --- the checker catches broken pages ---------------------------------------------

BROKEN = """<!doctype html>
<html><head><meta charset="utf-8"><title>broken</title></head>
<body>
  <p>Raw math the renderer never saw: $x^2$ and \\(y\\).</p>
  <p><span class="math">\\(z\\)</span></p>
  <img src="missing.png" alt="a figure that is not there">
  <img src="ok.png" alt="a figure that is there">
  <a href="nowhere.html">a dead link</a>
  <a href="broken.html#no-such-anchor">a dead anchor</a>
  <div class="highlight"><pre>print("no copy button")</pre></div>
  <div class="highlight"><pre>wide = "%s"</pre></div>
  <table><tr><td>%s</td></tr></table>
  <article><table style="width: 30px"><tr>
    <td style="overflow-wrap: anywhere">reverse mode</td></tr></table></article>
  <div class="bd-sidebar-secondary"><nav><a href="#here2" style="display: block;
    width: 60px; overflow-wrap: anywhere">HiPrim.transpose()</a></nav></div>
  <div class="bd-sidebar-secondary" style="width: 80px; overflow: hidden"><nav>
    <a href="#here2" style="display: block; white-space: nowrap">SaveAndOffloadOnlyTheseNames</a>
  </nav></div>
  <article><h1 style="width: 150px">Porting <code>hijax.custom_<wbr>vjp</code></h1></article>
  <p id="here2"></p>
  <code>$code is fine$</code>
  <script>console.error("boom")</script>
  <script src="https://example.invalid/remote.js"></script>
</body></html>
""".replace("%s", "x" * 400, 1).replace("%s", "y" * 400, 1)

GOOD = """<!doctype html>
<html><head><meta charset="utf-8"><title>fine</title></head>
<body><p id="here">No math, <code>$HOME</code> in code is fine.</p>
  <img src="ok.png" alt="figure"><a href="#here">here</a>
  <a href="good.html">self</a></body></html>
"""

# A 1x1 PNG.
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")


def _png(width, height=20):
  """A grey PNG of ``width`` x ``height`` pixels (a stand-in for a plot)."""
  import struct
  import zlib

  def chunk(kind, data):
    return (struct.pack(">I", len(data)) + kind + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff))
  rows = b"".join(b"\0" + b"\x80" * width for _ in range(height))
  return (b"\x89PNG\r\n\x1a\n"
          + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
          + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def test_checker_reports_a_broken_page(tmp_path, chromium):
  (tmp_path / "broken.html").write_text(BROKEN, encoding="utf-8")
  (tmp_path / "good.html").write_text(GOOD, encoding="utf-8")
  (tmp_path / "ok.png").write_bytes(PNG)
  with site_check.serve(tmp_path) as base, \
       site_check.browser(base, chromium) as b:
    broken = b.check_page(base + "broken.html")
    good = b.check_page(base + "good.html")
    blocked = list(b.blocked)
  text = "\n".join(broken)
  assert "raw math in text: 'Raw math the renderer never saw: $x^2$ and \\\\(y\\\\).'" in text
  assert "math not rendered by MathJax: '\\\\(z\\\\)'" in text
  assert "page has math but no MathJax output" in text
  assert "image did not load: missing.png" in text
  assert "image did not load: ok.png" not in text
  assert f"HTTP 404: {base}missing.png" in text
  assert f"broken link: {base}nowhere.html (HTTP 404)" in text
  assert "(no element with id 'no-such-anchor')" in text
  assert "2 code blocks but 0 copy buttons" in text
  assert re.search(r"code block scrolls sideways \(\d+ px too wide\): 'wide = \"x", text)
  assert re.search(r"table scrolls sideways \(\d+ px too wide\): 'yyy", text)
  assert "a table cell breaks inside a word: 'reverse'" in text
  assert re.search(r"the outline breaks inside a word: '(HiPrim\.|transpose\(\))'", text)
  assert re.search(r'the outline \("On this page"\) is cut off at its edge \(\d+ px wider '
                   r"than its box; 1 entries reach past it, e\.g\. \['SaveAndOffload", text)
  assert "a heading breaks inside a word or name: 'hijax.custom_vjp'" in text
  assert re.search(r"page is \d+ px wide in a 1280 px window", text)
  assert "console error: boom" in text
  assert "request failed: https://example.invalid/remote.js" in text
  assert "$code is fine$" not in text
  assert blocked == ["https://example.invalid/remote.js"]
  assert good == [], good


# A phone's view: a menu button that opens nothing, an outline whose entry
# breaks inside a word, a paragraph wider than the phone, grey on grey output.
PHONE_BROKEN = """<!doctype html>
<html><head><meta charset="utf-8"><title>phone</title></head>
<body>
  <div id="pst-primary-sidebar"><nav><a href="#x">Home</a></nav></div>
  <button class="primary-toggle">menu</button>
  <div class="bd-sidebar-secondary"><nav><a href="#x">Section</a></nav></div>
  <dialog id="pst-secondary-sidebar-modal" style="width: 300px"><nav>
    <a href="#x" style="display: block; width: 30px; overflow-wrap: anywhere">transpose</a>
    <a href="#x" style="display: block; white-space: nowrap">SaveAndOffloadOnlyTheseNames_and_more_of_the_same</a>
  </nav></dialog>
  <button class="secondary-toggle"
    onclick="document.getElementById('pst-secondary-sidebar-modal').showModal()">outline</button>
  <p id="x" style="width: 600px">A paragraph wider than a phone.</p>
  <div class="cell_output"><pre style="color: #444; background: #333">grey on grey</pre></div>
  <article><table class="autosummary"><tr><td style="white-space: nowrap">
    HiPrim_with_a_long_name_and_its_signature(x_aval, y_aval, z_aval)</td>
    <td>A description past the edge.</td></tr>
    <tr><td>VJPHiPrimitive</td><td></td></tr></table></article>
  <div class="cell_output"><img src="plot.png" alt="a plot" style="max-width: 100%"></div>
</body></html>
"""

# The same, working: both drawers open from their buttons (Escape closes a
# dialog), words fit, output is legible.
PHONE_GOOD = """<!doctype html>
<html><head><meta charset="utf-8"><title>phone</title></head>
<body>
  <div id="pst-primary-sidebar"></div>
  <dialog id="pst-primary-sidebar-modal" style="width: 300px"><nav>
    <a href="#x">Home</a></nav></dialog>
  <button class="primary-toggle"
    onclick="document.getElementById('pst-primary-sidebar-modal').showModal()">menu</button>
  <div class="bd-sidebar-secondary"><nav><a href="#x">Section</a></nav></div>
  <dialog id="pst-secondary-sidebar-modal" style="width: 300px"><nav>
    <a href="#x">Reverse-mode rules, transposed</a></nav></dialog>
  <button class="secondary-toggle"
    onclick="document.getElementById('pst-secondary-sidebar-modal').showModal()">outline</button>
  <article><h1>Porting <code>hijax.custom_vjp</code></h1>
    <table><tr><td>reverse mode</td><td>HiPrim.transpose()</td></tr></table>
    <table class="autosummary"><tr><td>HiPrim</td><td>Base class.</td></tr></table></article>
  <div class="cell_output"><pre>legible</pre></div>
  <div class="cell_output"><img src="plot.png" alt="a plot" style="max-width: 100%"></div>
  <p id="x" style="margin-top: 2000px">the section</p>
  <script>
    for (const d of document.querySelectorAll('dialog')) {
      d.addEventListener('click', e => { if (e.target.closest('a')) setTimeout(() => d.close(), 0); });
    }
  </script>
</body></html>
"""


def test_checker_reports_a_broken_phone_page(tmp_path, chromium):
  (tmp_path / "broken.html").write_text(PHONE_BROKEN, encoding="utf-8")
  (tmp_path / "good.html").write_text(PHONE_GOOD, encoding="utf-8")
  (tmp_path / "plot.png").write_bytes(_png(900))
  with site_check.serve(tmp_path) as base, \
       site_check.browser(base, chromium, site_check.PHONE, "dark") as b:
    broken = b.check_page(base + "broken.html", plot_fonts=[10.])
    good = b.check_page(base + "good.html", plot_fonts=[24.])
  text = "\n".join(broken)
  assert "the button did not open the navigation drawer (menu button)" in text
  assert "the outline (\"On this page\") breaks inside a word: 'transpose'" in text
  assert re.search(r"page is \d+ px wide in a 390 px window .*<p> \d+ px: "
                   r"\"A paragraph wider than a phone.\"", text)
  assert re.search(r"output text hard to read: contrast 1\.\d .*'grey on grey'", text)
  assert "following an entry of the outline (\"On this page\") left the drawer open" in text
  assert re.search(r"the outline \(\"On this page\"\) is cut off at its edge", text)
  assert "API summary table: the row of VJPHiPrimitive has no description" in text
  assert re.search(r"API summary table: the row of HiPrim_with_a_long_name.* runs off "
                   r"the screen", text)
  assert re.search(r"plot 1 \(plot\.png\): its 10 pt text is \d\.\d px tall as shown "
                   r"\(900 px wide, shown at \d+ px\)", text)
  assert good == [], good


# --- the real site ----------------------------------------------------------------

def test_site_in_chromium(site, chromium):
  """Every page, offline, in Chromium; screenshots in _build/screenshots/."""
  pages = site_check.site_pages(site)
  expected = ["index.html"] + [f"{p}.html" for p in _all_pages()
                               if (ROOT / "docs" / f"{p}.md").exists()]
  missing = [p for p in expected if p not in pages]
  assert not missing, f"pages not built: {missing}"
  start = time.monotonic()
  report = site_check.check_site(site, screenshots=SCREENSHOTS, chromium=chromium)
  elapsed = time.monotonic() - start
  lines = [f"{page}:\n  " + "\n  ".join(problems) for page, problems in report.items()]
  assert not report, "\n".join(lines)
  shots = {p.stem for p in SCREENSHOTS.glob("*.png")}
  for page in expected:
    name = page.removesuffix(".html")
    assert {name, f"{name}-390", f"{name}-390-menu"} <= shots, name
  print(f"{len(pages)} pages checked in Chromium at two widths in {elapsed:.1f} s")


def _notebook_pages(site):
  return [p for p in _all_pages()
          if (site / f"{p}.html").exists() and _is_notebook(ROOT / "docs" / f"{p}.md")]


def test_notebook_downloads(site):
  """Each notebook page offers its .md and executed .ipynb for download,
  locally, and the notebook marks the cells the site hides."""
  marks = _load_tool("notebook_marks")
  pages = _notebook_pages(site)
  assert pages
  for page in pages:
    html = (site / f"{page}.html").read_text(encoding="utf-8")
    for ext in (".md", ".ipynb"):
      href = f"_sources/{page}{ext}"
      assert f'href="{href}"' in html, f"{page}.html has no download link to {href}"
      assert (site / href).is_file(), f"{href} is linked but not in the build"
      assert (site / f"{href}.js").is_file(), f"{href}.js (for a site opened from disk)"
    nb = json.loads((site / f"_sources/{page}.ipynb").read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and any(c.get("outputs") for c in code), \
        f"{page}.ipynb has no executed code cells"
    for cell in code:
      hidden = bool({"remove-cell", "remove-input"} & set(cell["metadata"].get("tags", [])))
      first = "".join(cell["source"]).split("\n")[0]
      assert hidden == (first in marks.MARKS.values()), (page, first)


def test_notebook_download_saves_the_file(site, chromium):
  """The download menu's notebook is saved, not shown, from the served site
  and from the site opened from disk (file://), and is the built file."""
  page = "implicit" if (site / "implicit.html").exists() else _notebook_pages(site)[0]
  built = (site / "_sources" / f"{page}.ipynb").read_bytes()
  with site_check.serve(site) as base:
    served, got = site_check.check_download(f"{base}{page}.html", chromium)
    assert served == [] and got == built, served
  from_disk, got = site_check.check_download((site / f"{page}.html").resolve().as_uri(),
                                             chromium)
  assert from_disk == [] and got == built, from_disk


def test_search_from_disk_shows_excerpts(site, chromium):
  """Opened from disk, the search page finds `HiPrim` and shows an excerpt
  under each page it lists (tools/sphinx_offline_search.py)."""
  search = (site / "search.html").resolve().as_uri()
  with site_check.browser("http://127.0.0.1/", chromium) as b:
    problems = b.check_search(search, "HiPrim")
  assert problems == [], problems


def test_page_text_for_offline_search_keeps_sections_and_drops_the_theme():
  search = _load_tool("sphinx_offline_search")
  page = """<html><body><nav>site navigation</nav>
    <main id="main-content" class="bd-main" role="main">
      <div class="bd-header-article">Download Light Dark</div>
      <section id="top"><h1>Title<a class="headerlink" href="#top">#</a></h1>
        <p>Some   text\n with <code>a &lt; b</code>.</p>
        <section id="part"><h2>Part</h2><div><div>nested</div></div></section>
        <section><p>unnamed</p></section>
      </section>
      <div class="bd-sidebar-secondary"><div>Contents <div>Part</div></div></div>
      <script>var x = "<section>";</script>
    </main><footer>site footer</footer></body></html>"""
  text = search.main_text(page)
  # As a browser's textContent: no space where the HTML has none.
  assert text == ('<div role="main">  <section id="top">Title Some text with a &lt; b. '
                  '<section id="part">Partnested</section> unnamed </section>   </div>'), text



def test_the_size_of_a_plots_text_is_read_from_its_cell():
  """site_layout.figure_font_pt: matplotlib's default, 10 pt, or the smallest
  size the cell sets; unknown where the cell changes the defaults."""
  layout = _load_tool("site_layout")
  assert layout.figure_font_pt("plt.plot(x); plt.show()") == 10.
  assert layout.figure_font_pt("ax.legend(fontsize='small'); ax.set_title(t, fontsize=12)") \
      == 8.33
  assert layout.figure_font_pt("ax.text(0, 0, s, fontsize=9)\nfig, ax = plt.subplots("
                               "figsize=(4, 3))") == 9.
  for unknown in ("plt.rcParams['font.size'] = 6", "fig.savefig(f, dpi=300)",
                  "ax.legend(fontsize=size_of_the_day)"):
    assert layout.figure_font_pt(unknown) is None, unknown
