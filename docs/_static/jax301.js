/* JAX 301: small fixes to the theme and the downloads (conf.py: html_js_files).
 * tests/test_site.py checks each of them in Chromium at 1280 and 390 px.
 */
(() => {
  "use strict";

  /* 1. The menu button and "On this page" (pydata-sphinx-theme 0.20.0 with
   * sphinx-book-theme 1.4.0). Each theme binds its click handler to the
   * FIRST `.primary-toggle` / `.secondary-toggle` of the page, which is the
   * button in the header this site hides; the buttons a reader sees (the
   * article's header bar) got no handler, so on a phone neither the
   * navigation drawer nor the page outline opened. A click on a visible
   * button is handed to the first one, whose handlers open the drawer (or,
   * from 992 px up, fold the sidebar away). Only the first one's handlers
   * run, so a theme release that binds every button does not toggle twice. */
  function forwardSidebarToggles() {
    for (const kind of ["primary", "secondary"]) {
      const [first, ...others] = document.querySelectorAll(`.${kind}-toggle`);
      for (const button of others) {
        button.addEventListener("click", (event) => {
          event.preventDefault();
          event.stopImmediatePropagation();
          first.click();
        }, true);
      }
    }
  }

  /* 1b. A drawer closes when one of its links is followed. On a phone the
   * outline ("On this page") and the navigation open as modal dialogs
   * over the page; the theme closes them only on Escape or a click
   * outside, so an entry of the outline scrolled the page to its section
   * and left the drawer covering it. The dialog closes once the browser has
   * followed the link (a link to another page loads that page anyway). The
   * theme hands focus back to the button that opened the dialog when it
   * closes; that focus must not scroll the page away from the section. */
  function closeDrawersOnNavigation() {
    for (const id of ["pst-secondary-sidebar-modal", "pst-primary-sidebar-modal"]) {
      const dialog = document.getElementById(id);
      if (!dialog) continue;
      dialog.addEventListener("click", (event) => {
        const link = event.target.closest("a[href]");
        if (!link || !dialog.open) return;
        setTimeout(() => {
          const y = window.scrollY;
          dialog.close();
          window.scrollTo(window.scrollX, y);  // the theme's focus() may scroll
        }, 0);
      });
    }
  }

  /* 2. Names in code break at their dots and underscores, not inside a word.
   * Sphinx sets each word of inline code in a `span.pre` that never wraps,
   * so a long name (`jax.checkpoint_policies.nothing_saveable`) either
   * pushes a phone's page wider than the screen or, with CSS's
   * `overflow-wrap: anywhere`, is cut between any two letters. Each such
   * span is cut into one span per part, "jax." "checkpoint_" "policies."
   * ..., with a `<wbr>` between them: still no break inside a part (each
   * part keeps `white-space: nowrap`), but a line may now end after a dot or
   * an underscore that precedes a letter. A long name in CamelCase
   * (`SaveAndOffloadOnlyTheseNames`, wider than the outline's column) may
   * also wrap where a capital follows a small letter. An API signature may
   * also wrap after its opening parenthesis. Names in headings do not wrap:
   * a title breaks between its words only. */
  const BETWEEN_PARTS = /(?<=[A-Za-z0-9)\]][._]+)(?=[A-Za-z])/;
  const CAMEL_PARTS = /(?<=[a-z])(?=[A-Z])/;
  const LONG_NAME = 20;  // characters; shorter CamelCase names stay whole
  function breakNamesAtDots(root) {
    for (const paren of root.querySelectorAll(".sig .sig-paren")) {
      if (paren.textContent === "(") paren.after(document.createElement("wbr"));
    }
    for (const pre of root.querySelectorAll("code span.pre, .sig span.pre")) {
      if (pre.children.length) continue;  // only plain text spans
      if (pre.closest("h1, h2, h3, h4, h5, h6")) continue;
      let parts = pre.textContent.split(BETWEEN_PARTS);
      if (pre.textContent.length >= LONG_NAME) {
        parts = parts.flatMap((part) => part.split(CAMEL_PARTS));
      }
      if (parts.length < 2) continue;
      const frag = document.createDocumentFragment();
      parts.forEach((part, i) => {
        if (i) frag.append(document.createElement("wbr"));
        const piece = pre.cloneNode(false);
        piece.textContent = part;
        frag.append(piece);
      });
      pre.replaceWith(frag);
    }
  }

  /* 3. The download menu's .ipynb and .md: saved, not shown. Served over
   * http(s), the link's `download` attribute makes the browser save the
   * file. Opened from disk (file://), a browser ignores that attribute and
   * shows the notebook's JSON, and it may not fetch the file either; so
   * there the click loads `<file>.js` (written by tools/sphinx_jax301.py),
   * which hands the file's text to jax301SaveSource, which saves it. */
  const TYPES = {ipynb: "application/x-ipynb+json", md: "text/markdown"};
  window.jax301SaveSource = (name, text) => {
    const ext = name.split(".").pop();
    const url = URL.createObjectURL(new Blob([text], {type: TYPES[ext] || "text/plain"}));
    const a = document.createElement("a");
    a.href = url;
    a.download = name;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
  };
  function saveDownloads() {
    for (const a of document.querySelectorAll('a[href*="_sources/"]')) {
      const name = a.getAttribute("href").split("/").pop();
      if (!/\.(ipynb|md)$/.test(name)) continue;
      a.setAttribute("download", name);
      if (location.protocol !== "file:") continue;
      a.addEventListener("click", (event) => {
        event.preventDefault();
        const script = document.createElement("script");
        script.src = a.getAttribute("href") + ".js";
        script.onload = () => script.remove();
        document.head.append(script);
      });
    }
  }

  /* 4. Search excerpts on a site opened from disk. Sphinx's search page
   * fetches each result's page to cut an excerpt from it; a page opened from
   * disk may not fetch files, so every excerpt was missing. There, such a
   * fetch is answered from `_search_text/<page>.js` (the page's text, written
   * by tools/sphinx_offline_search.py), which a script tag may load. */
  function answerPageFetchesFromScripts() {
    const root = new URL(document.documentElement.dataset.content_root || "./", location.href);
    const waiting = {};  // page -> resolve functions of the fetches waiting for it
    window.jax301PageText = (page, text) => {
      for (const resolve of waiting[page] || []) {
        resolve(new Response(text, {headers: {"Content-Type": "text/html"}}));
      }
      delete waiting[page];
    };
    const fetchFromNetwork = window.fetch;
    window.fetch = (resource, options) => {
      const url = new URL(resource instanceof Request ? resource.url : resource, location.href);
      const page = url.href.startsWith(root.href) ? url.href.slice(root.href.length) : "";
      if (url.protocol !== "file:" || !page.endsWith(".html")) {
        return fetchFromNetwork(resource, options);
      }
      return new Promise((resolve, reject) => {
        (waiting[page] = waiting[page] || []).push(resolve);
        const script = document.createElement("script");
        script.src = new URL(`_search_text/${page.slice(0, -".html".length)}.js`, root).href;
        script.onload = () => script.remove();
        script.onerror = () => {
          script.remove();
          reject(new TypeError(`cannot load ${script.src}`));
        };
        document.head.append(script);
      });
    };
  }
  if (location.protocol === "file:") answerPageFetchesFromScripts();

  function ready(fn) {
    if (document.readyState !== "loading") fn();
    else document.addEventListener("DOMContentLoaded", fn);
  }
  ready(() => {
    forwardSidebarToggles();
    closeDrawersOnNavigation();
    breakNamesAtDots(document);
    saveDownloads();
  });
})();
