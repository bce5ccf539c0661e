#!/usr/bin/env bash
# Session 13, run2 (2 x H100): the decode GEMM+reduce-scatter's timeline (where its tail goes),
# in a graph as bench tp times it, and the TP calls' host time with the GEMM steps' stream
# swapped by set_stream against session 12's torch.cuda.stream() context, in one process.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session13/run2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run2; mkdir -p $R
D=benchmarks/2026-11-26-h100x2-session13
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
PYTHONPATH=src timeout 150 python3 scripts/tp_timeline.py --op gemm_rs --shapes 1024x3584x8192,8192x14336x4096 \
    --schedules direct,direct-s2 --rounds 9 --machine-kind nvidia-h100-x2 --json $R/rs_timeline.json \
    --markdown $R/rs_timeline.md > $R/rs_timeline.log 2>&1
echo "rs timeline exit $? at $((SECONDS-t0)) s"; cat $R/rs_timeline.md
HOST_PROFILE_AB=1 OUT=$R PYTHONPATH=src timeout 240 python3 $D/host_profile.py > $R/host_profile.log 2>&1
echo "host_profile exit $? at $((SECONDS-t0)) s"; grep "host us" $R/host_profile.log
PYTHONPATH=src timeout 200 python3 -m conccl bench tp --out $R/decode_graph --graph --ops gemm_rs --shapes 1024x3584x8192 \
    --schedules direct,direct-s2 --runs 40 --machine-kind nvidia-h100-x2 > $R/decode_graph.log 2>&1
echo "decode graph exit $? at $((SECONDS-t0)) s"; grep "^| gemm_rs" $R/decode_graph/tp.md | cut -d'|' -f2-10
cd $OUT && tar czf run2.tgz run2 && rm -rf run2
