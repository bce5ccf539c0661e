#!/usr/bin/env bash
# Host time of the 2048-token FSDP2 step by function (issue 40 item 5): stock against
# direct=True, bf16, both model shapes, cProfile on rank 0 after the timed run.
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-session4/run1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
PYTHONPATH=src timeout 200 python3 -m conccl bench fsdp --out $OUT/shape1 --configs stock,conccl_direct --tokens 2048 \
    --train-steps 10 --warmup 3 --no-profile --no-deterministic-loss --host-profile \
    --machine-kind $CONCCL_MACHINE_KIND > $OUT/shape1.log 2>&1
echo "shape1 exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/shape1/fsdp.md | cut -d'|' -f2-6
PYTHONPATH=src timeout 200 python3 -m conccl bench fsdp --out $OUT/shape2 --configs stock,conccl_direct --tokens 2048 \
    --dim 5120 --ffn 13824 --heads 40 --layers 6 --train-steps 10 --warmup 3 --no-profile --no-deterministic-loss \
    --host-profile --machine-kind $CONCCL_MACHINE_KIND > $OUT/shape2.log 2>&1
echo "shape2 exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/shape2/fsdp.md | cut -d'|' -f2-6
rm -f $OUT/*/fsdp.json.tmp
