#!/usr/bin/env bash
# Session 15, run4: what run3 did not run after the settled pipelines' mark edges: the settled
# graph, graph and compile GPU tests, the rig's tp, tp_layers and graph parts at worlds 2-3,
# the decode shapes eager and captured in one process each (aligned, two turns), and the host
# bench of session 14 (graphs against driver calls).
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h100x2-session15/run4.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run4; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
PYTHONPATH=src timeout 200 python3 -m pytest -q tests/gpu/test_gpu_settled_graph.py tests/gpu/test_gpu_graphs.py \
    tests/gpu/test_gpu_tp_compile.py > $R/gpu_tests.log 2>&1
echo "gpu tests exit $? at $((SECONDS-t0)) s: $(tail -1 $R/gpu_tests.log)"
CONCCL_RIG_TIMEOUT=200 CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 240 python3 -m pytest -q tests/rig \
    -k "tp-w2 or tp-w3 or tp_layers-w2 or graph-w2" > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s: $(tail -1 $R/rig.log)"
for turn in 1 2; do
  for mode in eager graph; do
    flag=""; [ $mode = graph ] && flag="--graph"
    PYTHONPATH=src timeout 80 python3 -m conccl bench tp --out $R/${mode}_$turn --ops gemm_rs,ag_gemm \
        --impls gemm_only,conccl,torch_async_tp --schedules direct,push-s2 --runs 30 --align $flag \
        --machine-kind nvidia-h100-x2 --shapes 1024x3584x8192,1024x8192x7168 > $R/${mode}_$turn.log 2>&1
    echo "$mode turn $turn exit $? at $((SECONDS-t0)) s"
    grep '^| \(gemm_rs\|ag_gemm\)' $R/${mode}_$turn/tp.md 2>/dev/null | cut -d'|' -f2-9
  done
done
OUT=$R PYTHONPATH=src timeout 60 python3 benchmarks/2026-11-27-h100x2-session14/host_tp.py > $R/host_tp.log 2>&1
echo "host_tp exit $? at $((SECONDS-t0)) s"; grep -v Warning $R/host_tp.log | tail -5
cd $OUT && tar czf run4.tgz run4 && rm -rf run4
