#!/usr/bin/env bash
# Issue 39, fifth run, at the session's TP commit: the GPU tests, the rig's tensor-parallel
# parts at worlds 2 and 3 (and the eager part with its settled calls), the op bench with
# schedule="auto" planning from the two-GPU pipelines now shipped in the H200 table, and the
# MLP block. One archive back.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session5/run5.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
R=$OUT/r; mkdir -p $R
t0=$SECONDS
PYTHONPATH=src timeout 120 python3 -m pytest -q tests/gpu/test_gpu_tp.py tests/gpu/test_gpu_tp_compile.py > $R/gpu_tp.log 2>&1
echo "gpu tp exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu_tp.log; grep "FAILED\|ERROR" $R/gpu_tp.log | head -5
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 150 python3 -m pytest -q tests/rig \
    -k "tp-w2 or tp-w3 or tp_layers-w2 or tp_layers-w3 or bench_tp-w2 or eager-w2" > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $R/rig.log; grep -i "failed" $R/rig.log | head -5
PYTHONPATH=src timeout 150 python3 -m conccl bench tp --out $R/ops --impls gemm_only,serial_nccl,torch_async_tp,conccl_auto \
    --machine-kind $CONCCL_MACHINE_KIND > $R/ops.log 2>&1
echo "ops exit $? at $((SECONDS-t0)) s"; grep "^| ag_gemm\|^| gemm_rs" $R/ops/tp.md | grep -v "serial_nccl\|gemm_only" | cut -d'|' -f2-8
PYTHONPATH=src timeout $((560 - (SECONDS - t0))) python3 -m conccl bench tp --out $R/block --block --runs 10 \
    --machine-kind $CONCCL_MACHINE_KIND > $R/block.log 2>&1
echo "block exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $R/block/block.md | cut -d'|' -f3-11
tar -C $OUT -czf $OUT/run5.tgz r && rm -rf $R
