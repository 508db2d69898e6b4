#!/usr/bin/env python
"""Check that a built site loads nothing from the network.

  python tools/check_offline_html.py _build/html

Fails (exit 1) if any HTML page loads a script, stylesheet, font, image,
frame or other resource from an http(s) or protocol-relative URL, if any CSS
file imports or references such a URL, or if a page refers to a local
script/stylesheet that is not in the build. Plain hyperlinks (<a href>) are
fine: they load nothing by themselves. Also checks that MathJax is served from
the local copy and that pages with math load it.
"""
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

REMOTE = re.compile(r"^\s*(https?:)?//", re.I)
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")]+)['"]?\s*\)|@import\s+['"]([^'"]+)['"]""", re.I)
# <link rel=...> values that make the browser fetch the target.
FETCHING_RELS = {"stylesheet", "preload", "prefetch", "modulepreload", "icon",
                 "shortcut", "apple-touch-icon", "manifest", "preconnect", "dns-prefetch"}


class Resources(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.found = []  # (tag, url)
        self.inline_css = []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script" and a.get("src"):
            self.found.append(("script", a["src"]))
        elif tag == "link" and a.get("href"):
            rels = set((a.get("rel") or "").lower().split())
            if rels & FETCHING_RELS:
                self.found.append((f"link rel={a.get('rel')}", a["href"]))
        elif tag in ("img", "iframe", "embed", "source", "audio", "video", "track", "input"):
            for key in ("src", "srcset", "poster", "data"):
                if a.get(key):
                    for part in a[key].split(","):
                        url = part.strip().split(" ")[0]
                        if url:
                            self.found.append((tag, url))
        elif tag == "object" and a.get("data"):
            self.found.append((tag, a["data"]))
        if a.get("style"):
            self.inline_css.append(a["style"])
        if tag == "style":
            self._in_style = True

    def handle_endtag(self, tag):
        if tag == "style":
            self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.inline_css.append(data)


def css_urls(text):
    for m in CSS_URL.finditer(text):
        yield m.group(1) or m.group(2)


def check(site):
    site = Path(site)
    errors = []
    # HTML under _static is theme template macros, not pages.
    pages = sorted(p for p in site.rglob("*.html") if "_static" not in p.relative_to(site).parts)
    if not pages:
        return [f"no HTML pages under {site}"], 0
    for page in pages:
        rel = page.relative_to(site)
        parser = Resources()
        parser.feed(page.read_text(encoding="utf-8"))
        for tag, url in parser.found:
            if REMOTE.match(url):
                errors.append(f"{rel}: <{tag}> loads remote {url}")
                continue
            if url.startswith(("data:", "#", "javascript:")):
                continue
            path = unquote(urlsplit(url).path)
            if path and tag.startswith(("script", "link")) and not (page.parent / path).exists():
                errors.append(f"{rel}: <{tag}> refers to missing local file {url}")
        for css in parser.inline_css:
            errors += [f"{rel}: inline style loads remote {u}" for u in css_urls(css) if REMOTE.match(u)]
        html = page.read_text(encoding="utf-8")
        has_math = 'class="math' in html
        scripts = [u for t, u in parser.found if t == "script"]
        mathjax = [u for u in scripts if "mathjax" in u.lower()]
        if has_math and not mathjax:
            errors.append(f"{rel}: has math but loads no MathJax")
        for u in mathjax:
            if "_static/mathjax/" not in u:
                errors.append(f"{rel}: MathJax not from the local copy: {u}")
    fonts = site / "_static" / "mathjax" / "output" / "chtml" / "fonts" / "woff-v2"
    if (site / "_static" / "mathjax").exists() and not any(fonts.glob("*.woff")):
        errors.append(f"MathJax fonts missing: {fonts.relative_to(site)}")
    for css in sorted(site.rglob("*.css")):
        rel = css.relative_to(site)
        for u in css_urls(css.read_text(encoding="utf-8", errors="replace")):
            if REMOTE.match(u):
                errors.append(f"{rel}: CSS loads remote {u}")
    return errors, len(pages)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    errors, n = check(sys.argv[1])
    for e in errors:
        print(e)
    if errors:
        sys.exit(f"{len(errors)} problem(s): the site would load resources from the network")
    print(f"offline check: {n} HTML pages load no remote scripts, styles, fonts or images")


if __name__ == "__main__":
    main()
