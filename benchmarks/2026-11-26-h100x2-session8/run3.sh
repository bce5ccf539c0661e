#!/usr/bin/env bash
# Four GPUs (nvidia-h100-x4): the GPU tier's collectives, graphs (the forked own copy), settled
# graphs, TP, EP, eager path and persistent ops at world 4 on real GPUs, beside the shared-GPU
# rig's TP parts at world 4 on GPU 3 (correctness only, both); then conccl bench graphs at
# world 4 alone (in a graph: NCCL, conccl plain, conccl.empty push, in place).
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session8/run3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/r; mkdir -p $R
t0=$SECONDS
nvidia-smi --query-gpu=name --format=csv > $R/gpus.txt 2>&1; nvidia-smi topo -m >> $R/gpus.txt 2>&1
(CUDA_VISIBLE_DEVICES=3 PYTHONPATH=src timeout 330 python3 -m pytest -q tests/rig \
   -k "tp-w4 or tp_layers-w4 or bench_tp-w4 or graph-w4" > $R/rig_w4.log 2>&1; echo "rig w4 exit $?" >> $R/rig_w4.log) &
rig=$!
PYTHONPATH=src timeout 340 python3 -m pytest -q tests/gpu/test_cuda_collectives.py tests/gpu/test_gpu_all_reduce.py \
  tests/gpu/test_gpu_graphs.py tests/gpu/test_gpu_settled_graph.py tests/gpu/test_gpu_tp.py tests/gpu/test_gpu_ep.py \
  tests/gpu/test_gpu_eager_path.py tests/gpu/test_gpu_persistent.py > $R/gpu_w4.log 2>&1
echo "gpu w4 exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu_w4.log; grep "^FAILED\|^E " $R/gpu_w4.log | head -10
wait $rig; tail -2 $R/rig_w4.log; echo "rig done at $((SECONDS-t0)) s"
PYTHONPATH=src timeout 170 python3 -m conccl bench graphs --modes graph --sizes 4K,64K,1M,16M \
  --impls nccl,conccl,conccl_symm_push,conccl_symm_push_in_place --out $R/graphs_w4 --machine-kind nvidia-h100-x4 \
  > $R/graphs_w4.log 2>&1
echo "graphs w4 exit $? at $((SECONDS-t0)) s"
tar -C $OUT -czf $OUT/run3.tgz r
