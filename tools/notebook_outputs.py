"""What `tools/notebooks.py build` does to a freshly executed notebook before writing it.

A committed notebook is what the site shows and what nbval compares a fresh
run with, so it must hold no noise a reader scrolls past and no trace of the
machine that built it, and building an unchanged page again must write the
same file (`git diff` empty). `normalise` does, in order:

* cell ids derived from each cell's content, not random (`stable_ids`);
* what the machine, not the page, wrote to stderr dropped (XLA's
  slow-operation alarms, check_rules' progress line on a loaded machine:
  the pattern of notebooks/conftest.py, which makes nbval skip the same in a
  fresh run);
* stream outputs merged per stream name, the way nbval merges them before
  comparing (`coalesce_streams`), so how the kernel split a cell's printing
  into messages leaves no mark;
* tracebacks cut to the exception messages and the frames of the page's own
  cells (`short_traceback`): no JAX-internal or library frame, at most
  `MAX_TRACEBACK_LINES` lines where it can be done. nbval never compares
  tracebacks (only the exception's name and message), so this changes
  nothing it checks;
* machine paths masked (`mask`): the rules of tools/nbval_sanitize.cfg marked
  ``stored: masked`` (kernel cell files, installed packages, the checkout,
  temporary files) are applied to every text output. nbval applies the same
  rules to both sides, and each replacement is left alone by every rule, so
  a stored masked output still equals a fresh unmasked one;
* outputs that vary between runs kept (`keep_unchanged`): when the page's
  code is the same as in the notebook already there, a cell whose fresh
  outputs equal the stored ones under every sanitize rule (an address, a
  duration), or a cell tagged ``nbval-ignore-output`` (timings), keeps the
  stored outputs. Any change to the page's code stores everything afresh.
"""
from __future__ import annotations

import configparser
import copy
import hashlib
import importlib.util
import json
import re
from pathlib import Path

SANITIZE_CFG = Path(__file__).resolve().parent / "nbval_sanitize.cfg"
MAX_TRACEBACK_LINES = 15

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# IPython's chain separators between the exceptions of one traceback.
_SEPARATOR = re.compile(r"^\s*(The above exception was the direct cause of the "
                        r"following exception|During handling of the above "
                        r"exception, another exception occurred):?\s*$")
_HEADER = re.compile(r"^(-{20,}|\S+\s+Traceback \(most recent call last\))\s*$")
_FRAME = re.compile(r"^(File |Cell In\[|\s*\[\.\.\. skipping hidden)")
_CELL_FRAME = re.compile(r"^Cell In\[\d+\]")
_ARROW = re.compile(r"^-*> ")
# Exceptions that only carry JAX's record of where a traced operation came
# from; their message repeats the one that follows.
_PLUMBING = ("JaxStackTraceBeforeTransformation", "UnfilteredStackTrace")


def _notebooks_conftest():
  """notebooks/conftest.py, which says what of a kernel's stderr is the machine's."""
  path = Path(__file__).resolve().parent.parent / "notebooks" / "conftest.py"
  spec = importlib.util.spec_from_file_location("_hijax_notebooks_conftest", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


_is_machine_stderr = _notebooks_conftest()._is_machine_stderr


def plain(text: str) -> str:
  """``text`` without ANSI colour codes."""
  return _ANSI.sub("", text)


# --- sanitize rules -------------------------------------------------------------

def sanitize_rules(path: Path = SANITIZE_CFG):
  """``(all_rules, stored_rules)``: (compiled regex, replacement) pairs, in file order.

  ``all_rules`` is what nbval applies before comparing; ``stored_rules`` the
  ones marked ``stored: masked``, applied to the committed notebook too.
  """
  cfg = configparser.ConfigParser(interpolation=None)
  cfg.read(path, encoding="utf-8")
  everything, stored = [], []
  for section in cfg.sections():
    rule = (re.compile(cfg[section]["regex"]), cfg[section]["replace"])
    everything.append(rule)
    if cfg[section].get("stored", "").strip() == "masked":
      stored.append(rule)
  return everything, stored


def mask(text: str, rules) -> str:
  """``text`` with each rule's regex replaced, in order (as nbval does)."""
  for regex, replace in rules:
    text = regex.sub(replace, text)
  return text


def _map_text(output, fn):
  """``output`` with ``fn`` applied to each of its text fields (not images)."""
  out = copy.deepcopy(output)
  if "text" in out:
    out["text"] = fn(_joined(out["text"]))
  if "evalue" in out:
    out["evalue"] = fn(out["evalue"])
  if "traceback" in out:
    out["traceback"] = [fn(t) for t in out["traceback"]]
  for key, value in out.get("data", {}).items():
    if key.startswith("text/") or key in ("application/json",):
      if isinstance(value, (str, list)):
        out["data"][key] = fn(_joined(value))
  return out


def _joined(value):
  return "".join(value) if isinstance(value, list) else value


# --- streams and ids --------------------------------------------------------------

def coalesce_streams(outputs):
  """One output per stream name, at the first one's place (nbval's merge)."""
  merged, first = [], {}
  for output in outputs:
    if output.get("output_type") == "stream":
      name = output["name"]
      if name in first:
        first[name]["text"] = _joined(first[name]["text"]) + _joined(output["text"])
        continue
      output = copy.deepcopy(output)
      output["text"] = _joined(output["text"])
      first[name] = output
    merged.append(output)
  return merged


def stable_ids(cells):
  """Gives each cell an id made from its type and source (a suffix where repeated)."""
  seen = {}
  for cell in cells:
    digest = hashlib.sha256(
        (cell["cell_type"] + "\0" + _joined(cell["source"])).encode()).hexdigest()[:12]
    seen[digest] = seen.get(digest, 0) + 1
    cell["id"] = digest if seen[digest] == 1 else f"{digest}-{seen[digest]}"


# --- tracebacks --------------------------------------------------------------------

def _segments(traceback):
  """IPython's traceback entries split into one list per chained exception."""
  segments, separators, current = [], [], []
  for entry in traceback:
    if _SEPARATOR.match(plain(entry).strip("\n")):
      segments.append(current)
      separators.append(entry)
      current = []
    else:
      current.append(entry)
  segments.append(current)
  return segments, separators


def _parts(segment):
  """(header, cell frames, message entries) of one chained exception."""
  header, frames, message = None, [], []
  for entry in segment:
    text = plain(entry)
    if _HEADER.match(text.strip("\n")):
      if "Traceback" in text:
        header = entry
    elif _FRAME.match(text):
      if _CELL_FRAME.match(text):
        frames.append(entry)
    else:
      message.append(entry)
  return header, frames, message


def _arrow_only(frame):
  """A frame entry cut to its first line and the line marked with the arrow."""
  lines = frame.rstrip("\n").split("\n")
  keep = [lines[0]] + [l for l in lines[1:] if _ARROW.match(plain(l))]
  return "\n".join(keep) + "\n"


def _render(parts):
  out = []
  for separator, header, frames, message in parts:
    if separator is not None:
      out.append(separator)
    if frames and header is not None:
      out.append(header)
    out.extend(frames)
    out.extend(message)
  return out


def _line_count(entries):
  return len("\n".join(entries).split("\n"))


def _first_alone(parts):
  """The last exception only, without the separator that led to it."""
  _, header, frames, message = parts[-1]
  return [(None, header, frames, message)]


# How a traceback too long is cut, step by step, until it fits.
_CUTS = (
    lambda ps: [(s, h, [_arrow_only(f) for f in fs], m) for s, h, fs, m in ps],
    lambda ps: [(s, h, [], m) for s, h, _, m in ps[:-1]] + ps[-1:],
    _first_alone,
    lambda ps: [(s, h, [], m) for s, h, _, m in ps],
)


def short_traceback(traceback, limit=MAX_TRACEBACK_LINES):
  """IPython's traceback entries cut to what a reader of the page needs.

  Each chained exception keeps its message and the frames of the page's own
  cells (``Cell In[n]``); library frames (JAX, hijax, the kernel) and JAX's
  bookkeeping exceptions go. Over ``limit`` lines, frames lose their
  context lines, then the earlier exceptions lose their frames, then the
  earlier exceptions go, then the last one's frames, until it fits (a
  message longer than ``limit`` by itself stays whole).
  """
  segments, separators = _segments(traceback)
  parts = []
  for i, segment in enumerate(segments):
    header, frames, message = _parts(segment)
    first = plain(message[0]).lstrip() if message else ""
    if first.startswith(_PLUMBING) and i < len(segments) - 1:
      continue
    separator = separators[i - 1] if parts else None
    parts.append((separator, header, frames, message))
  for cut in _CUTS:
    if _line_count(_render(parts)) <= limit:
      break
    parts = cut(parts)
  return _render(parts)


# --- the whole notebook ----------------------------------------------------------

def clean_outputs(outputs, stored_rules):
  """A cell's outputs with streams merged, tracebacks short and paths masked."""
  cleaned = []
  for output in coalesce_streams([o for o in outputs if not _is_machine_stderr(o)]):
    if output.get("output_type") == "error":
      output = copy.deepcopy(output)
      output["traceback"] = short_traceback(output["traceback"])
    cleaned.append(_map_text(output, lambda t: mask(t, stored_rules)))
  return cleaned


def _comparable(outputs, rules):
  """Cleaned outputs as nbval would compare them, plus the tracebacks."""
  return json.dumps([_map_text(o, lambda t: mask(t, rules)) for o in outputs],
                    sort_keys=True)


def _code(nb):
  return [_joined(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def keep_unchanged(nb, previous, rules, stored_rules):
  """Where the code is unchanged, cells take their outputs from ``previous``.

  ``nb``'s outputs are already cleaned; ``previous``'s are cleaned here
  (a notebook written by this tool is left as it is). A cell keeps them if
  they equal the fresh ones under every sanitize rule, tracebacks included,
  or if the cell is tagged ``nbval-ignore-output``. Returns the number of
  cells whose stored outputs were kept where they differ from the fresh ones.
  """
  if previous is None or _code(previous) != _code(nb):
    return 0
  kept = 0
  old_cells = [c for c in previous["cells"] if c["cell_type"] == "code"]
  new_cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
  for new, old in zip(new_cells, old_cells):
    old_outputs = clean_outputs(old.get("outputs", []), stored_rules)
    ignored = "nbval-ignore-output" in new.get("metadata", {}).get("tags", [])
    if ignored or _comparable(new["outputs"], rules) == _comparable(old_outputs, rules):
      if new["outputs"] != old_outputs:
        kept += 1
      new["outputs"] = old_outputs
  return kept


def normalise(nb, previous=None, cfg: Path = SANITIZE_CFG):
  """Normalises executed notebook ``nb`` in place and returns it (module docstring).

  ``previous`` is the notebook already stored for the page, or None.
  """
  everything, stored = sanitize_rules(cfg)
  stable_ids(nb["cells"])
  for cell in nb["cells"]:
    if cell["cell_type"] == "code":
      cell["outputs"] = clean_outputs(cell.get("outputs", []), stored)
  keep_unchanged(nb, previous, everything, stored)
  return nb
