"""``conccl.tp`` and ``conccl.fsdp`` by every route a user takes, each in a fresh interpreter
(sys.modules empty of conccl): as attributes after a plain ``import conccl`` (which stays
light: neither loads until used) and as modules (``import conccl.tp``, ``import conccl.fsdp``),
one module object by every route."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch")

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"

# what `import conccl` must not load: tp, fsdp and ep, the API, the group and the CUDA executor
# behind it, torch itself and NumPy (tests/cli/test_cli_startup.py: the same without torch installed)
HEAVY = ["conccl.api", "conccl.group.group", "conccl.tp", "conccl.fsdp", "conccl.ep", "conccl.executors.cuda.executor",
         "conccl.runtime", "torch", "numpy"]
LIGHT = f"""
import sys
import conccl
loaded = [m for m in {HEAVY!r} if m in sys.modules]
assert not loaded, loaded
"""


def _run(code: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(SRC))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def test_conccl_fsdp_enable_after_a_plain_import_conccl():
    _run(LIGHT + """
assert callable(conccl.fsdp.enable)
assert conccl.fsdp is sys.modules["conccl.fsdp"]
""")


def test_conccl_tp_attributes_after_a_plain_import_conccl():
    _run(LIGHT + """
assert callable(conccl.tp.all_gather_matmul) and conccl.tp.ColumnParallelLinear
assert conccl.tp is sys.modules["conccl.tp"]
try:
    conccl.no_such_name
except AttributeError:
    pass
else:
    raise AssertionError("conccl.no_such_name did not raise AttributeError")
""")


def test_import_conccl_tp_by_every_route_is_one_module():
    _run("""
import sys
import conccl.tp
from conccl.tp import RowParallelLinear, matmul_reduce_scatter
from conccl.tp.layers import ColumnParallelLinear
import conccl.tp as real
from conccl.tp import layers
assert conccl.tp is real and RowParallelLinear is real.RowParallelLinear and callable(matmul_reduce_scatter)
assert ColumnParallelLinear is layers.ColumnParallelLinear and sys.modules["conccl.tp.layers"] is layers
assert real.__spec__.name == "conccl.tp" and layers.__spec__.name == "conccl.tp.layers"
""")


def test_import_conccl_fsdp_and_from_conccl_import_both():
    _run("""
import conccl.fsdp
assert callable(conccl.fsdp.enable)
from conccl import fsdp, tp
import conccl.tp
assert fsdp is conccl.fsdp and tp is conccl.tp
""")


def test_conccl_ep_by_attribute_and_by_import_is_one_module():
    _run(LIGHT + """
assert callable(conccl.ep.dispatch) and callable(conccl.ep.combine)
assert conccl.ep is sys.modules["conccl.ep"]
import conccl.ep as again
assert again is conccl.ep
""")
