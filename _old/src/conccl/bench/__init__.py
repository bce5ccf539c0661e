"""``conccl bench``: compare conccl with NCCL and PyTorch's copy-engine paths."""
