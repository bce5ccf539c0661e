#!/usr/bin/env bash
# Four GPUs (nvidia-h100-x4), after run3: the GPU tests that failed at world 4 (their checks
# fixed) and the GPU tier files not run there yet, beside the rig's graph and eager parts on
# GPU 3; then conccl bench graphs in a graph at world 4 and at world 2 (GPUs 0-1): captured
# calls now a branch per peer by default (Options.graph_stream_mode) against one stream.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session8/run4.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/r; mkdir -p $R
t0=$SECONDS
(CUDA_VISIBLE_DEVICES=3 PYTHONPATH=src timeout 300 python3 -m pytest -q tests/rig \
   -k "graph-w2 or graph-w3 or graph-w4 or eager-w4" > $R/rig.log 2>&1; echo "rig exit $?" >> $R/rig.log) &
rig=$!
PYTHONPATH=src timeout 330 python3 -m pytest -q tests/gpu/test_gpu_all_reduce.py tests/gpu/test_gpu_tp.py \
  tests/gpu/test_gpu_graphs.py tests/gpu/test_gpu_reduce_scatter.py tests/gpu/test_gpu_one_shot.py \
  tests/gpu/test_gpu_fsdp.py tests/gpu/test_gpu_readdress.py tests/gpu/test_gpu_ep_graph.py \
  tests/gpu/test_gpu_tp_compile.py > $R/gpu_w4.log 2>&1
echo "gpu w4 exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu_w4.log; grep "^FAILED\|^E " $R/gpu_w4.log | head -12
wait $rig; tail -2 $R/rig.log; echo "rig done at $((SECONDS-t0)) s"
G="--modes graph --sizes 4K,64K,1M,16M --impls nccl,conccl,conccl_batch,conccl_symm_push,conccl_symm_push_batch,conccl_symm_push_in_place"
PYTHONPATH=src timeout 120 python3 -m conccl bench graphs $G --out $R/graphs_w4 --machine-kind nvidia-h100-x4 > $R/graphs_w4.log 2>&1
echo "graphs w4 exit $? at $((SECONDS-t0)) s"
PYTHONPATH=src timeout 100 python3 -m conccl bench graphs $G --gpus 2 --out $R/graphs_w2 --machine-kind nvidia-h100-x4 \
  > $R/graphs_w2.log 2>&1
echo "graphs w2 exit $? at $((SECONDS-t0)) s"
tar -C $OUT -czf $OUT/run4.tgz r
