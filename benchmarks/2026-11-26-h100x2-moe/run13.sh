#!/usr/bin/env bash
# Thirteenth run (2026-11-26, second session), the last of the session's device time: bench fsdp
# after the pooled parameters and held gradients (fsdp_direct.reuse, reduce_scatter._HELD), the
# rig's fsdp part at worlds 2 and 3 and ep at 4, bench moe's fixed-size implementations, then the
# whole GPU tier in what time is left (-v: each test's result, even where the time runs out).
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-moe/run13.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
PYTHONPATH=src timeout 200 python3 -m conccl bench fsdp --out $OUT/fsdp --configs no_comm,stock,conccl_direct \
    --train-steps 10 --warmup 3 --no-profile --machine-kind $CONCCL_MACHINE_KIND > $OUT/fsdp.log 2>&1
echo "bench fsdp exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/fsdp/fsdp.md
CUDA_VISIBLE_DEVICES=0 CONCCL_RIG_JSON=$OUT/rig PYTHONPATH=src timeout 110 python3 -m pytest -q tests/rig -k "fsdp-w2 or fsdp-w3 or ep-w4" > $OUT/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -2 $OUT/rig.log
PYTHONPATH=src timeout 60 python3 -m conccl bench moe --out $OUT/moe --runs 6 --impls conccl,conccl_fixed,conccl_graph,reference,nccl_a2a \
    --train-steps 0 --layer-chunks 0 > $OUT/moe.log 2>&1
echo "bench moe exit $? at $((SECONDS-t0)) s"; grep "^| random\|^| skewed" $OUT/moe.log | cut -d'|' -f1-8,15
PYTHONPATH=src timeout $((585 - (SECONDS - t0))) python3 -m pytest -v tests/gpu > $OUT/gpu_tier.log 2>&1
echo "gpu tier exit $? at $((SECONDS-t0)) s"; grep -c PASSED $OUT/gpu_tier.log; grep "FAILED\|ERROR" $OUT/gpu_tier.log | head; tail -1 $OUT/gpu_tier.log
