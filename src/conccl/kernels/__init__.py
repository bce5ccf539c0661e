"""The few SM kernels conccl runs, their CUDA C in ``kernels/cuda/`` (one ``.cu`` each and the
shared header ``conccl.cuh``), compiled at run time by NVRTC through :mod:`.loader`: a
reduction's sum (:mod:`.reduce`), a one-warp signal wait (:mod:`.spin`), a whole small call in
one CTA (:mod:`.one_shot`), MoE combine's gathered sum (:mod:`.gather_sum`) and MoE dispatch's
layouts (:mod:`.moe_route`). Every other byte conccl moves, it moves with copy engines."""
