#!/usr/bin/env bash
# NOT RUN this session (its device time was spent): the GPU check of the review fixes made after
# run5 (settled graphs captured on a stream of their own, node counts checked, the gate against
# the tensors, the default stream excluded) and the rig's new settled-graph case.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session7/run6.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}
R=$OUT/r; mkdir -p $R
t0=$SECONDS
PYTHONPATH=src timeout 100 python3 -m pytest -q -s tests/gpu/test_gpu_settled_graph.py > $R/gpu_settled.log 2>&1
echo "settled test exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu_settled.log; grep "FAILED\|^E " $R/gpu_settled.log | head -6
PYTHONPATH=src timeout 300 python3 -m pytest -q "tests/gpu/test_cuda_collectives.py::test_bitwise_equal_to_nccl" \
    "tests/gpu/test_cuda_collectives.py::test_profiler_shows_no_kernel" tests/gpu/test_gpu_all_reduce.py tests/gpu/test_gpu_graphs.py \
    tests/gpu/test_gpu_eager_path.py tests/gpu/test_gpu_persistent.py tests/gpu/test_gpu_fsdp.py > $R/gpu.log 2>&1
echo "gpu exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu.log; grep "FAILED\|^E " $R/gpu.log | head -8
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 200 python3 -m pytest -q tests/rig -k "eager-w2 or eager-w3 or eager-w4 or persistent-w2 or graph-w2" > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $R/rig.log; grep "FAILED\|false\|False" $R/rig.log | head -5
LAT="--impls conccl_symm_pull,conccl_symm_push,nccl --collectives all_gather,reduce_scatter,all_to_all,all_reduce --sizes 4096,65536,1048576 -n 200 --reps 5 --phases"
CONCCL_SETTLED_GRAPHS=0 PYTHONPATH=src timeout 100 python3 -m conccl.bench.latency --out $R/lat_off $LAT > $R/lat_off.log 2>&1; echo "off exit $?"
PYTHONPATH=src timeout 100 python3 -m conccl.bench.latency --out $R/lat_on $LAT > $R/lat_on.log 2>&1; echo "on exit $?"
tar -C $OUT -czf $OUT/run6.tgz r
