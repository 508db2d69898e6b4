#!/usr/bin/env bash
# Refresh the local MathJax copy served by the docs (docs/_static/mathjax).
# The site must build and render math with no network, so the few files the
# browser needs are kept in the repository: the TeX->CommonHTML bundle with
# every TeX extension built in, and its woff-v2 fonts (about 1.8 MB).
# Needs npm and the npm registry; run from anywhere.
set -euo pipefail
VERSION=3.2.2
here="$(cd "$(dirname "$0")/.." && pwd)"
dest="$here/docs/_static/mathjax"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
npm install --silent --no-audit --no-fund --prefix "$tmp" "mathjax@$VERSION"
src="$tmp/node_modules/mathjax"
rm -rf "$dest"
mkdir -p "$dest/output/chtml/fonts"
cp "$src/es5/tex-chtml-full.js" "$dest/"
cp -r "$src/es5/output/chtml/fonts/woff-v2" "$dest/output/chtml/fonts/"
cp "$src/LICENSE" "$dest/LICENSE"
printf 'MathJax %s (npm package mathjax), es5/tex-chtml-full.js and its woff-v2 fonts.\nRegenerate with tools/vendor_mathjax.sh.\n' "$VERSION" > "$dest/README"
du -sh "$dest"
