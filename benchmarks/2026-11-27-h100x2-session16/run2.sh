#!/usr/bin/env bash
# Session 16, run2: issue 38's goals measured again at one commit, every figure of its goal list
# in one run on one machine: collectives in a CUDA graph and eager against NCCL (plain tensors,
# conccl.empty, in place, auto), their completion beside running GEMMs, host and GPU time per
# eager call (conccl, persistent ops, NCCL), the SM one-shot path, conccl.tp at decode size in a
# graph and eager (aligned), bus bandwidth at 64 MiB-1 GiB, TP host time per settled call.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h100x2-session16/run2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=nvidia-h100-x2
OUT=${OUT:?}; R=$OUT/run2; mkdir -p $R
t0=$SECONDS
left() { echo $((575 - (SECONDS - t0))); }
nvidia-smi -L > $R/gpus.txt
K=nvidia-h100-x2
PYTHONPATH=src timeout 130 python3 -m conccl bench graphs --out $R/graphs --modes graph,eager --sizes 4K,64K,1M,16M \
    --impls nccl,conccl,conccl_auto,conccl_symm_push,conccl_symm_push_in_place --machine-kind $K > $R/graphs.log 2>&1
echo "graphs exit $? at $((SECONDS-t0)) s"
for mode in graph eager; do
  flag=""; [ $mode = graph ] && flag="--graph"
  PYTHONPATH=src timeout 90 python3 -m conccl bench tp --out $R/tp_$mode $flag --ops gemm_rs,ag_gemm \
      --impls gemm_only,conccl,conccl_auto,torch_async_tp --schedules direct,push-s2 --runs 30 --align \
      --machine-kind $K --shapes 1024x3584x8192,1024x8192x7168 > $R/tp_$mode.log 2>&1
  echo "tp $mode exit $? at $((SECONDS-t0)) s"
done
PYTHONPATH=src timeout 90 python3 -m conccl.bench.latency --out $R/latency \
    --impls nccl,conccl,conccl_symm_push,conccl_persistent,conccl_auto --sizes 4096,65536,1048576,16777216 \
    > $R/latency.log 2>&1
echo "latency exit $? at $((SECONDS-t0)) s"
PYTHONPATH=src timeout 80 python3 -m conccl bench graphs --out $R/beside --modes beside --sizes 64K,1M,16M \
    --impls nccl,conccl,conccl_symm_push_via_peer,conccl_symm_push_in_place --machine-kind $K > $R/beside.log 2>&1
echo "beside exit $? at $((SECONDS-t0)) s"
CONCCL_ONE_SHOT_BELOW=2M PYTHONPATH=src timeout 70 python3 -m conccl bench graphs --out $R/one_shot --modes graph,eager \
    --sizes 4K,64K,1M --collectives all_gather,reduce_scatter,all_reduce --impls nccl,conccl,conccl_symm_push \
    --machine-kind $K > $R/one_shot.log 2>&1
echo "one_shot exit $? at $((SECONDS-t0)) s"
t=$(left); [ $t -gt 70 ] && t=70
[ $t -gt 20 ] && { PYTHONPATH=src timeout $t python3 -m conccl bench -b 64M -e 1G -f 4 --impl nccl,conccl --no-profile \
    --json $R/busbw.json --markdown $R/busbw.md --machine-kind $K > $R/busbw.log 2>&1; echo "busbw exit $? at $((SECONDS-t0)) s"; }
t=$(left); [ $t -gt 60 ] && t=60
[ $t -gt 30 ] && { OUT=$R PYTHONPATH=src timeout $t python3 benchmarks/2026-11-27-h100x2-session14/host_tp.py > $R/host_tp.log 2>&1; echo "host_tp exit $? at $((SECONDS-t0)) s"; }
cd $OUT && tar czf run2.tgz run2 && rm -rf run2
