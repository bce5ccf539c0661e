#!/usr/bin/env bash
# Issue 39 push pipeline, after the review: 1. GPU TP tests (push with return_gathered: the
# copies into A now behind the GEMM steps); 2. the rig: tp at world 2, and every non-collective
# part at world 4 again (captured push now free-gated); 3. the op bench, both ops, with `auto`
# from the new shipped tables (push there); 4. the MLP block with auto (now push), direct, push.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session12/run5.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
R=$OUT/r; mkdir -p $R
t0=$SECONDS
nvidia-smi --query-gpu=name,memory.total --format=csv > $R/gpus.txt 2>&1
cat $R/gpus.txt
PYTHONPATH=src timeout 150 python3 -m pytest -q tests/gpu/test_gpu_tp.py > $R/gpu.log 2>&1
echo "gpu exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu.log; grep "^FAILED\|^E " $R/gpu.log | head -12
CONCCL_RIG_TIMEOUT=200 CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 220 \
    python3 -m pytest -q tests/rig -k "tp-w2 or w4 and not eager and not graph and not persistent" > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $R/rig.log; grep "^FAILED\|^E " $R/rig.log | head -12
PYTHONPATH=src timeout 150 python3 -m conccl bench tp --out $R/ops --impls gemm_only,torch_async_tp,conccl,conccl_auto \
    --machine-kind $CONCCL_MACHINE_KIND > $R/ops.log 2>&1
echo "ops exit $? at $((SECONDS-t0)) s"
PYTHONPATH=src timeout $((585 - (SECONDS - t0))) python3 -m conccl bench tp --out $R/block --block --schedules auto,direct,push \
    --machine-kind $CONCCL_MACHINE_KIND > $R/block.log 2>&1
echo "block exit $? at $((SECONDS-t0)) s"; grep "conccl\|async\|compute" $R/block/block.md | cut -d'|' -f3-7
tar -C $OUT -czf $OUT/run5.tgz r
