#!/usr/bin/env bash
# NOT RUN this session (its device time was spent): issue 39 on 2 x H100, where none of its
# figures was ever taken: the op bench (async-TP, conccl auto; the H100 ships no two-GPU
# pipelines, so auto plans from the one-GPU model here), then the MLP block with PyTorch's own
# DTensor plan (torch_tp_plan) and conccl.tp.parallelize_module (conccl_plan) beside the rest.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session6/run8.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
R=$OUT/r; mkdir -p $R
t0=$SECONDS
PYTHONPATH=src timeout 200 python3 -m conccl bench tp --out $R/ops --impls gemm_only,serial_nccl,torch_async_tp,conccl,conccl_auto \
    --machine-kind $CONCCL_MACHINE_KIND > $R/ops.log 2>&1
echo "ops exit $? at $((SECONDS-t0)) s"; grep "^| ag_gemm\|^| gemm_rs" $R/ops/tp.md | grep -v "serial_nccl\|gemm_only" | cut -d'|' -f2-8
PYTHONPATH=src timeout $((560 - (SECONDS - t0))) python3 -m conccl bench tp --out $R/block --block --runs 10 \
    --machine-kind $CONCCL_MACHINE_KIND > $R/block.log 2>&1
echo "block exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $R/block/block.md | cut -d'|' -f3-11
tar -C $OUT -czf $OUT/run8.tgz r
