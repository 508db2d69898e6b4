"""`import hijax` loads no checker and starts or registers nothing;
`hijax.testing` loads when first used. Each in a fresh interpreter."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _run(code: str) -> str:
  done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, text=True,
                        capture_output=True, env={"PYTHONPATH": str(ROOT),
                                                  "JAX_PLATFORMS": "cpu"},
                        check=False)
  assert done.returncode == 0, done.stderr
  return done.stdout


def test_import_hijax_loads_no_checker_and_registers_nothing():
  out = _run(
      "import atexit, sys, threading, jax, jax.numpy\n"
      "hooks, threads = atexit._ncallbacks(), threading.active_count()\n"
      "import hijax\n"
      "print(sorted(m for m in sys.modules if m.startswith('hijax.testing')),"
      " atexit._ncallbacks() - hooks, threading.active_count() - threads)\n"
      "print(hijax.testing.check_rules.__module__)\n")
  assert out.splitlines() == ["[] 0 0", "hijax.testing"], out


def test_an_unknown_attribute_is_an_attribute_error():
  out = _run("import hijax\n"
             "try:\n  hijax.no_such_name\n"
             "except AttributeError as e:\n  print(e)\n")
  assert out.strip() == "module 'hijax' has no attribute 'no_such_name'"
