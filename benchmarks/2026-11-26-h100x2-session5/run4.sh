#!/usr/bin/env bash
# Issue 39 item 3, planning from two-GPU runs: the op bench (both ops, 8 shapes each, every
# schedule) keeping its pipelines' times in a copy of the shipped profile of this GPU
# (bench tp --profile), then the same shapes with schedule="auto" planning from that profile
# (CONCCL_PROFILE), beside async-TP and the GEMM alone. One archive back.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session5/run4.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
R=$OUT/r; mkdir -p $R
t0=$SECONDS
if nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H200; then
  cp src/conccl/data/h200x4_profile.json $R/profile.json
else
  cp src/conccl/data/h100x2_profile.json $R/profile.json
fi
PYTHONPATH=src timeout 330 python3 -m conccl bench tp --out $R/ops_a \
    --schedules serial,direct,direct-p2,direct-p4,direct-p4-g2,ring-p2,direct-p8 --profile $R/profile.json \
    --machine-kind $CONCCL_MACHINE_KIND > $R/ops_a.log 2>&1
echo "ops (every schedule) exit $? at $((SECONDS-t0)) s"; tail -1 $R/ops_a.log
CONCCL_PROFILE=$R/profile.json PYTHONPATH=src timeout $((560 - (SECONDS - t0))) python3 -m conccl bench tp --out $R/ops_b \
    --impls gemm_only,torch_async_tp,conccl_auto --machine-kind $CONCCL_MACHINE_KIND > $R/ops_b.log 2>&1
echo "ops (auto from the runs) exit $? at $((SECONDS-t0)) s"; grep "^| ag_gemm\|^| gemm_rs" $R/ops_b/tp.md | cut -d'|' -f2-8
tar -C $OUT -czf $OUT/run4.tgz r && rm -rf $R
