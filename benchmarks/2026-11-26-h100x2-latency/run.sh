#!/usr/bin/env bash
# Issue 38 on nvidia-h100-x2: the double-buffered protocol against the one before it (99aad54,
# unpacked in old_tree/ by `git archive 99aad54 src | tar -x -C old_tree`), in one run:
# `conccl bench graphs` (NCCL and conccl, in a graph and eager), old, new, old, new; then the
# whole GPU tier on the new tree.
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-latency/run.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
{ nvidia-smi -L; python3 -c "import torch; print(torch.__version__, torch.cuda.nccl.version(), torch.cuda.device_count())"; } > $OUT/env.txt 2>&1
graphs() {  # $1 tree (src folder), $2 name
  PYTHONPATH=$1 timeout 150 python3 -m conccl bench graphs --out $OUT/graphs_$2 --sizes 4K,64K,1M,16M \
    --collectives all_gather,all_to_all,reduce_scatter,all_reduce --impls nccl,conccl --runs 5 > $OUT/graphs_$2.log 2>&1
  echo "bench graphs $2 exit $? at $((SECONDS-t0)) s"
}
graphs old_tree/src old1
graphs src new1
graphs old_tree/src old2
graphs src new2
PYTHONPATH=src timeout $((590-SECONDS+t0)) python3 -m pytest -q tests/gpu > $OUT/gpu_tier.log 2>&1
echo "GPU tier exit $? at $((SECONDS-t0)) s"; tail -5 $OUT/gpu_tier.log
