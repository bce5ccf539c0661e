"""The shared-GPU rig tier: conccl's ranks as processes sharing one GPU (harness.py), its parts
as tests (test_shared_gpu.py, opt-in: conftest.py)."""
