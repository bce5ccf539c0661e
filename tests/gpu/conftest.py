"""The GPU tier: every test here is marked ``gpu`` and skipped without CUDA or with fewer than
2 GPUs (each test starts one process per GPU)."""
from __future__ import annotations

import pathlib

import pytest

HERE = pathlib.Path(__file__).parent


def _gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs CUDA and at least 2 GPUs") if _gpus() < 2 else None
    for item in items:
        if HERE in pathlib.Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.gpu)
            if skip:
                item.add_marker(skip)
