"""Each notebook runs when downloaded alone: copied into an empty folder, with
hijax installed and nothing else of the checkout beside it.

The `tests` nox session runs nbval on such copies (noxfile.py,
`notebooks_alone`: each notebook alone in an empty folder of its own,
outside the checkout), so every page is executed that way once per run. The
cheap check here fails sooner, and names the line: no notebook's code reads
a path outside its own folder (the checkout's docs/ or tools/, or anything
through `..`). A page that shows recorded results carries them in
its `page-data` cell (tools/page_data.py), which holds data, not paths, and
is left out here.
"""
import ast
import io
import json
import re
import tokenize
from pathlib import Path

import pytest

pytestmark = pytest.mark.pages

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

# a path out of the notebook's folder, or into the checkout's docs/ or tools/
_OUTSIDE = re.compile(r"\.\.(/|\\|$)|(docs|tools)/")


def paths_outside(source: str) -> list[str]:
  """The string literals of a code cell (comments and IPython's magic lines
  left out) that name a path outside the notebook's folder."""
  lines = ["" if line.lstrip().startswith(("%", "!")) else line
           for line in source.splitlines(keepends=True)]
  try:
    tokens = list(tokenize.generate_tokens(io.StringIO("".join(lines)).readline))
  except (tokenize.TokenError, SyntaxError):  # not Python alone: every quoted text
    return [m[2] for m in re.finditer(r"""(['"])((?:(?!\1).)*)\1""", source)
            if _OUTSIDE.match(m[2])]
  found = []
  for token in tokens:
    if token.type == tokenize.STRING:
      try:
        value = ast.literal_eval(token.string)
      except (ValueError, SyntaxError):
        continue
    elif token.type == getattr(tokenize, "FSTRING_MIDDLE", None):
      value = token.string
    else:
      continue
    if isinstance(value, str) and _OUTSIDE.match(value):
      found.append(value)
  return found


def test_the_notebooks_are_found():
  if not NOTEBOOKS:
    pytest.skip("no notebooks/ (an sdist)")
  assert len(NOTEBOOKS) >= 20


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_notebook_reads_a_path_outside_its_folder(notebook):
  cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
  found = [(i, line) for i, cell in enumerate(cells)
           if cell["cell_type"] == "code"
           and "page-data" not in cell.get("metadata", {}).get("tags", [])
           for line in paths_outside("".join(cell["source"]))]
  assert not found, (
      f"{notebook.name} reads files beside the checkout, which a reader who "
      f"downloads it lacks (carry recorded results in a page-data cell: "
      f"tools/page_data.py): {found}")


def test_a_path_outside_is_found_and_a_comment_is_not():
  assert paths_outside('p = Path("../docs/accelerator-results.json")') == [
      "../docs/accelerator-results.json"]
  assert paths_outside("json.loads(open('tools/x.json').read())") == ["tools/x.json"]
  assert paths_outside('RESULTS = pathlib.Path("..") / "tools"') == [".."]
  assert paths_outside('p = f"docs/{name}.md"') == ["docs/"]
  assert paths_outside('%cd ..\n# from docs/accelerator-results.json\n') == []
  assert paths_outside('x = RECORD["facts"]  # from "docs/x.json"') == []
  assert paths_outside('%%timeit\nopen("../x", (') == ["../x"]  # not Python: read as text
  assert paths_outside('open("rules.json", "w"); t.startswith("tests/zoo.py")') == []




def test_nbval_runs_each_notebook_alone_in_an_empty_folder(noxfile, tmp_path):
  """`notebooks_alone` gives each notebook a folder of its own holding only
  it, and puts nbval's settings (notebooks/conftest.py) in the folder above,
  where no kernel runs; the `tests` session runs nbval on those copies."""
  source = tmp_path / "notebooks"
  source.mkdir()
  for name in ("a.ipynb", "b.ipynb"):
    (source / name).write_text(name)
  (source / "conftest.py").write_text("# nbval settings\n")
  (source / "data.json").write_text("{}")  # left behind: no notebook may need it
  alone = tmp_path / "alone"
  alone.mkdir()
  copies = noxfile.notebooks_alone(source, alone)
  assert copies == [str(alone / "a" / "a.ipynb"), str(alone / "b" / "b.ipynb")]
  for copy in map(Path, copies):
    assert [p.name for p in copy.parent.iterdir()] == [copy.name]
    assert copy.read_text() == copy.name
  assert sorted(p.name for p in alone.iterdir()) == ["a", "b", "conftest.py"]
  body = re.search(r"^def tests\(session\):(.*?)^(?:def|@)",
                   (ROOT / "noxfile.py").read_text(), re.S | re.M).group(1)
  assert 'notebooks_alone("notebooks", alone)' in body
  # nbval is given the folder (each cell's id then names its notebook)
  assert 'paths = ["tests", alone]' in body
  assert "tempfile.mkdtemp(" in body  # outside the checkout
  assert "Path(\"notebooks\").glob" not in body  # not the checkout's own copies
