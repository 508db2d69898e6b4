"""Pages carry the recorded results they show (tools/page_data.py)."""
import pytest

from tools_loader import load_tool

page_data = load_tool("page_data")


def test_every_page_data_cell_is_what_its_record_gives():
  assert page_data.stale() == []


def test_a_cell_is_written_from_its_extractor(tmp_path, monkeypatch):
  page = tmp_path / "p.md"
  page.write_text("# P\n\n```{code-cell}\n:tags: [remove-cell, page-data]\n\nRECORD = 0\n```\n"
                  "\nText.\n")
  monkeypatch.setattr(page_data, "DOCS", tmp_path)
  monkeypatch.setattr(page_data, "EXTRACTORS", {})  # the real pages' are not in tmp_path
  monkeypatch.setitem(page_data.EXTRACTORS, "p", page_data.extractor("p", "x.json")(
      lambda: {"a": [1, 2.5], "b": None}))
  assert page_data.stale() == ["p"]
  assert page_data.write("p")
  assert page_data.stale() == []
  namespace = {}
  exec(page_data.current("p"), namespace)
  assert namespace["RECORD"] == {"a": [1, 2.5], "b": None}
  assert page.read_text().endswith("```\n\nText.\n")
  assert not page_data.write("p")


def test_a_page_without_the_cell_is_refused(tmp_path, monkeypatch):
  (tmp_path / "q.md").write_text("# Q\n")
  monkeypatch.setattr(page_data, "DOCS", tmp_path)
  monkeypatch.setitem(page_data.EXTRACTORS, "q", lambda: 1)
  with pytest.raises(SystemExit, match="has no code cell tagged 'page-data'"):
    page_data.write("q")


def test_pick_keeps_the_record_s_nesting():
  record = {"a": {"b": {"c": 1, "d": 2}, "e": 3}, "f": {"g/h": [4]}}
  assert page_data.pick(record, ("a", "b", "c"), ("f", "g/h")) == {
      "a": {"b": {"c": 1}}, "f": {"g/h": [4]}}
  with pytest.raises(KeyError):
    page_data.pick(record, ("a", "x"))
