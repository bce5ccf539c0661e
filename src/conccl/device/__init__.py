"""What conccl asks of the device and the host beyond PyTorch: the CUDA driver calls PyTorch
does not expose (:mod:`.driver`), POSIX shared memory conccl alone manages (:mod:`.shm`),
SM partitions and CTA-capped NCCL groups (:mod:`.partitions`) and peer-reachable memory
(:mod:`.symmetric`)."""
