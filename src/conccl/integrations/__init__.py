"""Where users already are: tensor parallelism (:mod:`conccl.integrations.tp`, also
``conccl.tp``). FSDP2 lives in :mod:`conccl.fsdp`."""
