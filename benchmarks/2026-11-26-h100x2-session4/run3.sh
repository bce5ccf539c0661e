#!/usr/bin/env bash
# After the stand-in output (made once per home): the direct path's GPU tests, the rig's fsdp
# part at worlds 2 and 3, and the host profile at 2048 tokens, bf16, stock against direct=True.
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-session4/run3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
PYTHONPATH=src timeout 150 python3 -m pytest -q tests/gpu/test_gpu_fsdp.py > $OUT/gpu.log 2>&1
echo "gpu exit $? at $((SECONDS-t0)) s"; tail -1 $OUT/gpu.log; grep "FAILED\|ERROR" $OUT/gpu.log | head
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 120 python3 -m pytest -q tests/rig -k "fsdp-w2 or fsdp-w3" > $OUT/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $OUT/rig.log; grep -i "failed" $OUT/rig.log | head -5
PYTHONPATH=src timeout 110 python3 -m conccl bench fsdp --out $OUT/bf16 --configs stock,conccl_direct --tokens 2048 \
    --train-steps 10 --warmup 3 --no-profile --no-deterministic-loss --host-profile \
    --machine-kind $CONCCL_MACHINE_KIND > $OUT/bf16.log 2>&1
echo "bf16 exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/bf16/fsdp.md | cut -d'|' -f2-6
PYTHONPATH=src timeout $((300 - (SECONDS - t0))) torchrun --nproc-per-node 2 \
    benchmarks/2026-11-26-h100x2-session4/gather_lines.py > $OUT/gather_lines.log 2>&1
echo "lines exit $? at $((SECONDS-t0)) s"
rm -f $OUT/bf16.log
