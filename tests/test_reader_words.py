"""The pages and the README speak to users: what works, what it costs, what
to do. How the project was built (its sessions, the time it had on a
borrowed accelerator, the machine it was developed on, what was fixed
where) belongs in CHANGELOG.md and CONTRIBUTING.md.

Each phrase below once stood on a page, or is the obvious next word for the
same thing; the whole file is read, hidden cells too, since a downloaded
notebook shows them.
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
READ = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

PHRASES = [
    "device time", "device session", "device minutes",
    "later session", "next session", "each session", "this session",
    "earlier session", "previous session",
    "development CPU", "development machine", "two-core",
    "machine lent", "machines lent", "fixed on the CPU side",
    "--resume counted", "the tool's `--resume`", "used to judge",
]
_PATTERN = re.compile("|".join(re.escape(p) for p in PHRASES), re.I)


def development_words(text: str) -> list[str]:
  """``line N: phrase`` for each phrase about the project's development."""
  return [f"line {n}: {m[0]!r}" for n, line in enumerate(text.splitlines(), 1)
          for m in _PATTERN.finditer(line)]


@pytest.mark.parametrize("path", READ, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_words_about_the_project_s_development(path):
  if not path.exists():
    pytest.skip(f"no {path.name} (an sdist)")
  found = development_words(path.read_text(encoding="utf-8"))
  assert not found, (f"{path.relative_to(ROOT)} speaks of how the project is "
                     f"developed (move it to CHANGELOG.md or CONTRIBUTING.md): {found}")


def test_the_phrases_are_found_in_any_case_and_not_in_plain_prose():
  assert development_words("Each session had thirty minutes of Device Time.") == [
      "line 1: 'Each session'", "line 1: 'Device Time'"]
  assert development_words("x\nthe two-core development CPU") == [
      "line 2: 'two-core'", "line 2: 'development CPU'"]
  assert development_words("At the end of the pytest session, the rules are "
                           "checked; a TPU session runs as on a CPU.") == []
