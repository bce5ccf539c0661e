"""The one loader of conccl's SM kernels: CUDA C shipped as package data in ``kernels/cuda/``
(one ``.cu`` per kernel module, the device helpers they share in ``conccl.cuh``), compiled by
NVRTC at run time for the device's architecture and loaded on its primary context.

Every compile takes the same options, ``--gpu-architecture=compute_XY --std=c++17``, plus the
``-D`` defines its kernel module passes (CTA sizes, the poll sleep). A module is compiled and
loaded once per (source, defines, device): the architecture and so every option follow from
those. Importing this module needs neither CUDA nor cuda-python; NVRTC and the driver are
loaded where a kernel is first built.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from importlib import resources

from ..device.driver import check, driver

SOURCES = ("reduce", "spin", "one_shot", "gather_sum", "moe_route")  # kernels/cuda/<name>.cu
HEADERS = ("conccl.cuh",)  # what a source may #include, handed to NVRTC by name
STANDARD = "--std=c++17"
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"]+)[>"]', re.M)

Defines = tuple[tuple[str, int], ...]  # (name, value) pairs, sorted: a cache key


def _file_name(name: str) -> str:
    if name in SOURCES:
        return f"{name}.cu"
    if name in HEADERS:
        return name
    raise KeyError(f"conccl has no kernel source {name!r} (sources: {', '.join(SOURCES)}; headers: "
                   f"{', '.join(HEADERS)})")


def source(name: str) -> str:
    """The CUDA C text of kernel source ``name`` (one of :data:`SOURCES`, the file
    ``kernels/cuda/<name>.cu``) or of header ``name`` (one of :data:`HEADERS`), as shipped."""
    return resources.files(__package__).joinpath("cuda", _file_name(name)).read_text(encoding="utf-8")


def includes(text: str) -> list[str]:
    """The files ``text`` (CUDA C) names in its ``#include`` lines, in order."""
    return _INCLUDE.findall(text)


def _defines(defines: Mapping[str, int] | Defines | None) -> Defines:
    items = defines.items() if isinstance(defines, Mapping) else (defines or ())
    out = tuple(sorted((str(k), int(v)) for k, v in items))
    for k, _ in out:
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", k):
            raise ValueError(f"a kernel define must be an upper-case C identifier, got {k!r}")
    return out


def options(arch: str, defines: Mapping[str, int] | None = None) -> list[str]:
    """NVRTC's options for compute capability ``arch`` ("90": compute_90) with ``defines``."""
    return [f"--gpu-architecture=compute_{arch}", STANDARD] + [f"-D{k}={v}" for k, v in _defines(defines)]


def compile_ptx(name: str, arch: str, defines: Mapping[str, int] | None = None) -> bytes:
    """PTX of kernel source ``name`` for compute capability ``arch`` (e.g. "90") with
    ``defines``; needs cuda-python's NVRTC, no GPU. The headers of :data:`HEADERS` are handed
    to NVRTC, which includes no file from disk. A failed compile raises RuntimeError with
    NVRTC's log."""
    from cuda.bindings import nvrtc  # optional dependency: loaded where a kernel is first built

    text = source(name)
    unknown = [h for h in includes(text) if h not in HEADERS]
    if unknown:
        raise RuntimeError(f"conccl: kernels/cuda/{_file_name(name)} includes {', '.join(unknown)}, not shipped")

    def ok(err):
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"conccl: NVRTC error {err} building kernels/cuda/{_file_name(name)}")

    err, prog = nvrtc.nvrtcCreateProgram(text.encode(), _file_name(name).encode(), len(HEADERS),
                                         [source(h).encode() for h in HEADERS], [h.encode() for h in HEADERS])
    ok(err)
    try:
        opts = [o.encode() for o in options(arch, defines)]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(f"conccl: compiling kernels/cuda/{_file_name(name)} failed:\n"
                               f"{log.decode(errors='replace')}")
        _, size = nvrtc.nvrtcGetPTXSize(prog)
        ptx = b" " * size
        ok(nvrtc.nvrtcGetPTX(prog, ptx)[0])
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return ptx


def arch(device_index: int) -> str:
    """``device_index``'s compute capability as NVRTC's architecture number ("90" on H100)."""
    cu = driver()
    dev = check(cu.cuDeviceGet(device_index))
    major = check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev))
    minor = check(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev))
    return f"{major}{minor}"


@functools.lru_cache(maxsize=None)
def _module(name: str, defines: Defines, device_index: int):
    return check(driver().cuModuleLoadData(compile_ptx(name, arch(device_index), dict(defines))))


def module(device_index: int, name: str, defines: Mapping[str, int] | None = None):
    """The ``CUmodule`` of kernel source ``name`` compiled with ``defines`` for
    ``device_index``'s architecture, loaded on its primary context (current where torch runs
    there); compiled and loaded once per (source, defines, device)."""
    return _module(name, _defines(defines), device_index)


@functools.lru_cache(maxsize=None)
def _function(name: str, kernel: str, defines: Defines, device_index: int):
    return check(driver().cuModuleGetFunction(_module(name, defines, device_index), kernel.encode()))


def function(device_index: int, name: str, kernel: str, defines: Mapping[str, int] | None = None):
    """The ``CUfunction`` ``kernel`` (an ``extern "C"`` name) of :func:`module`'s module."""
    return _function(name, kernel, _defines(defines), device_index)
