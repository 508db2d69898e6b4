"""The built site in a real browser: headless Chromium, offline.

Checks _build/html (built by `nox -s docs`; `nox -s ci` runs this test, the
`site` session, once `docs` has ended) with tools/site_check.py: every page
loads with the network blocked except localhost, with no console errors or
failed requests, every image loaded, all math rendered by MathJax, a copy
button on every code block, every same-site link resolving, no code block or
table scrolling sideways at 1280 px; the search page finds `HiPrim`; each
page's notebook download is a notebook. A screenshot of each page goes to
_build/screenshots/. Deliberately broken pages check the checker.

Needs Playwright (the `site` extra; the `site` nox session installs it) and
Debian's Chromium (`apt-get install chromium`; the `site` and `ci` nox
sessions install it when run as root). Without them, or without a built
site, the tests are skipped with the reason, unless HIJAX_SITE_TEST=required
(set by the `site` nox session under CI), in which case they fail.
"""
from __future__ import annotations

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
  assert "console error: boom" in text
  assert "request failed: https://example.invalid/remote.js" in text
  assert "$code is fine$" not in text
  assert blocked == ["https://example.invalid/remote.js"]
  assert good == [], good


# --- the real site ----------------------------------------------------------------

def test_site_in_chromium(site, chromium):
  """Every page, offline, in Chromium; screenshots in _build/screenshots/."""
  pages = site_check.site_pages(site)
  expected = ["index.html"] + [f"{p}.html" for p in _conf_list("PAGES")
                               + _conf_list("APPENDIX") + _conf_list("BEYOND")
                               + _conf_list("SUBPAGES")
                               if (ROOT / "docs" / f"{p}.md").exists()]
  missing = [p for p in expected if p not in pages]
  assert not missing, f"pages not built: {missing}"
  start = time.monotonic()
  report = site_check.check_site(site, screenshots=SCREENSHOTS, chromium=chromium)
  elapsed = time.monotonic() - start
  lines = [f"{page}:\n  " + "\n  ".join(problems) for page, problems in report.items()]
  assert not report, "\n".join(lines)
  shots = {p.stem for p in SCREENSHOTS.glob("*.png")}
  assert {p.removesuffix(".html") for p in expected} <= shots
  print(f"{len(pages)} pages checked in Chromium in {elapsed:.1f} s")


def test_notebook_downloads(site):
  """Each notebook page offers its .md and executed .ipynb for download, locally."""
  pages = [p for p in (_conf_list("PAGES") + _conf_list("APPENDIX")
                       + _conf_list("BEYOND") + _conf_list("SUBPAGES"))
           if (site / f"{p}.html").exists() and _is_notebook(ROOT / "docs" / f"{p}.md")]
  assert pages
  for page in pages:
    html = (site / f"{page}.html").read_text(encoding="utf-8")
    for ext in (".md", ".ipynb"):
      href = f"_sources/{page}{ext}"
      assert f'href="{href}"' in html, f"{page}.html has no download link to {href}"
      assert (site / href).is_file(), f"{href} is linked but not in the build"
    nb = json.loads((site / f"_sources/{page}.ipynb").read_text(encoding="utf-8"))
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert code and any(c.get("outputs") for c in code), \
        f"{page}.ipynb has no executed code cells"
