"""What a collective moves, as plain data: one rank's :class:`~.base.Schedule` of transfers and
signals (:mod:`.base`), and its transforms: a call captured into a CUDA graph
(:mod:`.captured`) and a tensor-parallel pipeline with the GEMM cut in (:mod:`.pipeline`).
Nothing here touches a device."""
