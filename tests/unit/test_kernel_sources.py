"""The kernels' CUDA C as package data (src/conccl/kernels/cuda/): every .cu and .cuh is shipped
(pyproject's package data), every #include resolves to a shipped header, no device helper or
macro is defined in two files (conccl.cuh holds the shared ones), and every kernel module asks
the one loader for its kernels, which its source defines. Where cuda-python's NVRTC is present
(no GPU needed), every source compiles with the defines its module passes and its PTX holds
every kernel the module asks for; CPU CI has no NVRTC and skips that part."""
from __future__ import annotations

import fnmatch
import pathlib
import re
import sys

import pytest

from conccl.kernels import gather_sum, loader, moe_route, one_shot, reduce, spin

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "conccl"
CUDA = PACKAGE / "kernels" / "cuda"
MODULES = {"reduce": reduce, "spin": spin, "one_shot": one_shot, "gather_sum": gather_sum, "moe_route": moe_route}
# A device function's or kernel's definition (not a call): its name before "(" on a line that
# declares it __device__ or __global__, a body following; and a macro's.
DEFINITION = re.compile(r"^(?:template\s*<[^>]*>\s*)?(?:extern \"C\"\s+)?(?:__device__|__global__)[^;{(]*?"
                        r"(?:__launch_bounds__\([^)]*\)\s*)?\b(\w+)\s*\((?=[^;]*\{)", re.M)
MACRO = re.compile(r"^[ \t]*#[ \t]*define[ \t]+(\w+)", re.M)


def _package_data() -> list[str]:
    text = (ROOT / "pyproject.toml").read_text()
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib.loads(text)["tool"]["setuptools"]["package-data"]["conccl"]
    line = re.search(r"^\[tool\.setuptools\.package-data\]\nconccl = \[(.*)\]$", text, re.M).group(1)
    return re.findall(r'"([^"]+)"', line)


def test_every_kernel_source_is_one_the_loader_knows_and_is_shipped():
    files = sorted(p.name for p in CUDA.iterdir() if p.suffix in (".cu", ".cuh"))
    assert files == sorted([f"{n}.cu" for n in loader.SOURCES] + list(loader.HEADERS))
    assert sorted(p.name for p in CUDA.iterdir() if p.is_file()) == files  # nothing else there
    patterns = _package_data()
    for name in files:
        relative = f"kernels/cuda/{name}"
        assert any(fnmatch.fnmatch(relative, pattern) for pattern in patterns), (relative, patterns)
    for name in loader.SOURCES + loader.HEADERS:  # the loader reads what is in the package
        assert loader.source(name) == (CUDA / (name if name in loader.HEADERS else f"{name}.cu")).read_text()
    with pytest.raises(KeyError):
        loader.source("nothing")


def test_every_include_resolves_to_a_shipped_header():
    for name in loader.SOURCES:
        assert loader.includes(loader.source(name)) == ["conccl.cuh"], name
    for header in loader.HEADERS:
        assert set(loader.includes(loader.source(header))) <= set(loader.HEADERS), header
    assert loader.includes('#include "a.cuh"\n  # include <b.h>\n// #include "c"\n') == ["a.cuh", "b.h"]


def test_no_device_helper_or_macro_is_defined_in_two_files():
    where: dict[str, list[str]] = {}
    for name in loader.SOURCES + loader.HEADERS:
        text = loader.source(name)
        for defined in set(DEFINITION.findall(text)) | set(MACRO.findall(text)):
            where.setdefault(defined, []).append(name)
    twice = {defined: names for defined, names in where.items() if len(names) > 1}
    assert not twice, twice
    header = loader.source("conccl.cuh")
    for helper in ("half_to_float", "to_half", "unpack", "pack", "ld_acquire", "ld_relaxed", "st_relaxed",
                   "st_release", "fence_sys", "globaltimer", "wait_geq", "PICK"):
        assert where.get(helper) == ["conccl.cuh"], helper
    assert "#pragma once" in header
    assert DEFINITION.findall('extern "C" __global__ void __launch_bounds__(32) k(int n) {\n') == ["k"]
    assert DEFINITION.findall("__device__ __forceinline__ u32 f(const u32* p) {\n  return g(p);\n}\n") == ["f"]


def _requests(monkeypatch) -> dict[str, list[tuple]]:
    """{kernel module: [(source, kernel, defines), ...]}: what each kernel module asks the loader
    for when its kernels are first built (the loader faked: no CUDA)."""
    asked: dict[str, list[tuple]] = {}
    current = []

    def function(device_index, name, kernel, defines=None):
        asked.setdefault(current[0], []).append((name, kernel, dict(defines or {})))
        return f"{name}:{kernel}"

    monkeypatch.setattr(loader, "function", function)
    builders = {"reduce": reduce._functions, "spin": spin._function, "one_shot": one_shot._function,
                "gather_sum": gather_sum._functions, "moe_route": moe_route._functions}
    for module, build in builders.items():
        current[:] = [module]
        build.cache_clear()
        try:
            build(0)
        finally:
            build.cache_clear()
    return asked


def test_every_kernel_module_loads_its_own_source_through_the_loader(monkeypatch):
    asked = _requests(monkeypatch)
    assert sorted(asked) == sorted(MODULES)
    for module, requests in asked.items():
        assert {name for name, _, _ in requests} == {module}, module  # its own .cu, nothing else
        src = loader.source(module)
        for _, kernel, defines in requests:
            # the kernel is in its source (gather_sum.cu makes its kernels with a KERNEL macro)
            assert re.search(rf'extern "C" __global__ void (?:__launch_bounds__\(\w+\) )?{kernel}\(', src) or \
                f"KERNEL({kernel}," in src, (module, kernel)
            for option in re.findall(r"^#error \"conccl's [^\"]* compiled with (.+?) \(", src, re.M):
                needed = [w for w in option.split() if w != "and"]
                assert set(needed) <= set(defines), (module, needed, defines)
        text = pathlib.Path(MODULES[module].__file__).read_text()
        assert "__global__" not in text and "nvrtc" not in text.lower() and "load_module" not in text, module
    counts = {module: len(requests) for module, requests in asked.items()}
    assert counts == {"reduce": 11, "spin": 1, "one_shot": 1, "gather_sum": 6, "moe_route": 4}
    assert asked["spin"] == [("spin", "conccl_spin_wait", {"POLL_SLEEP_NS": spin.POLL_SLEEP_NS})]
    assert asked["one_shot"] == [("one_shot", "conccl_one_shot", {"THREADS": 1024, "POLL_SLEEP_NS": 20})]


def test_the_options_are_the_architecture_the_standard_and_the_defines():
    assert loader.options("90", {"THREADS": 1024, "POLL_SLEEP_NS": 20}) == [
        "--gpu-architecture=compute_90", "--std=c++17", "-DPOLL_SLEEP_NS=20", "-DTHREADS=1024"]
    assert loader.options("80") == ["--gpu-architecture=compute_80", "--std=c++17"]
    with pytest.raises(ValueError):
        loader.options("90", {"A=1 -DB": 2})


@pytest.mark.parametrize("arch", ["90", "80"])  # H100 and H200; A100
def test_every_source_compiles_with_nvrtc_and_defines_every_kernel_asked_for(monkeypatch, arch):
    pytest.importorskip("cuda.bindings.nvrtc", reason="needs cuda-python's NVRTC (no GPU needed)")
    for module, requests in _requests(monkeypatch).items():
        defines = requests[0][2]
        assert all(d == defines for _, _, d in requests)  # one module per source
        try:
            ptx = loader.compile_ptx(module, arch, defines).decode(errors="replace")
        except RuntimeError as e:
            if "libnvrtc" in str(e) or "not found" in str(e).lower():
                pytest.skip(f"NVRTC's library is missing: {e}")
            raise
        for _, kernel, _ in requests:
            assert f".entry {kernel}(" in ptx, (module, kernel)
