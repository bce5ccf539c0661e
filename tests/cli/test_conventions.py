"""What a Python user expects of a package: ``__version__`` and ``conccl --version`` from one
source, ``help(conccl)`` listing the public API, ``python -m conccl`` and the ``conccl`` entry
point behaving the same."""
from __future__ import annotations

import importlib
import pathlib
import pydoc
import re
import subprocess
import sys

import pytest

import conccl

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}


def _pyproject() -> str:
    return (ROOT / "pyproject.toml").read_text()


def test_version_has_one_source():
    from conccl import _version

    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", conccl.__version__)
    assert conccl.__version__ == _version.__version__
    text = _pyproject()
    # pyproject reads the version from conccl/_version.py rather than repeating it.
    assert re.search(r'^dynamic = \["version"\]', text, re.M)
    assert 'version = { attr = "conccl._version.__version__" }' in text
    assert not re.search(r'^version = "', text, re.M)


def test_help_lists_the_public_api_with_one_line_summaries():
    doc = pydoc.render_doc(conccl, renderer=pydoc.plaintext)
    for name in conccl.__all__:
        line = next((ln for ln in conccl.__doc__.splitlines() if ln.startswith(f"- ``{name}")), None)
        assert line is not None, f"{name} is public but help(conccl) does not list it"
        assert len(line.split(":", 1)[-1].split()) >= 3, line  # a summary, not just the name
        assert name in doc
        getattr(conccl, name)  # and it is there


def _entry_point_argv() -> list[str]:
    """What the installed `conccl` script runs: pyproject's [project.scripts] target, called."""
    target = re.search(r'^conccl = "([\w.]+):(\w+)"', _pyproject(), re.M)
    module, func = target.groups()
    assert callable(getattr(importlib.import_module(module), func))
    return [sys.executable, "-c", f"import sys; sys.argv[0] = 'conccl'; from {module} import {func}; sys.exit({func}())"]


@pytest.mark.parametrize("argv", [
    ["--version"],
    ["plan", "--gemm", "8192x8192x8192", "--size", "1G"],
    ["plan", "--gemm", "8x8x8", "--size", "1M", "--world", "1000"],
])
def test_python_m_conccl_and_the_entry_point_behave_the_same(argv):
    runs = [subprocess.run(cmd + argv, capture_output=True, text=True, env=ENV, timeout=120)
            for cmd in ([sys.executable, "-m", "conccl"], _entry_point_argv())]
    (a, b) = runs
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)
    if argv == ["--version"]:
        assert a.returncode == 0 and a.stdout.strip() == f"conccl {conccl.__version__}"
