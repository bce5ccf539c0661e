#!/usr/bin/env bash
# Issue 38 item 4 (run3: after run2, the own-shard copy of plain tensors read from the staged input in a graph): settled eager calls launched as one CUDA graph each
# (conccl/executors/cuda_graph_launch.py). GPU tests (the new one, the collectives against
# NCCL, graphs, the eager path, persistent ops, FSDP), bench.latency --phases with settled
# graphs off (CONCCL_SETTLED_GRAPHS=0) and on, in turns, twice; the shared-GPU rig.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session7/run3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
R=$OUT/r; mkdir -p $R
t0=$SECONDS
PYTHONPATH=src timeout 100 python3 -m pytest -q -s tests/gpu/test_gpu_settled_graph.py > $R/gpu_settled.log 2>&1
echo "settled test exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu_settled.log; grep "FAILED\|^E \|Error" $R/gpu_settled.log | head -12
LAT="--impls conccl,nccl --collectives all_gather,reduce_scatter,all_to_all,all_reduce --sizes 4096,65536,1048576 -n 200 --reps 5 --phases"
for rep in 1; do
  CONCCL_SETTLED_GRAPHS=0 PYTHONPATH=src timeout 100 python3 -m conccl.bench.latency --out $R/lat_off$rep $LAT > $R/lat_off$rep.log 2>&1
  echo "off exit $? at $((SECONDS-t0)) s"
  PYTHONPATH=src timeout 100 python3 -m conccl.bench.latency --out $R/lat_on$rep $LAT > $R/lat_on$rep.log 2>&1
  echo "on exit $? at $((SECONDS-t0)) s"
done
for f in lat_off1 lat_on1; do echo "== $f"; grep "^| all\|^| reduce" $R/$f/latency.md | cut -d'|' -f2-9 | head -24; done
PYTHONPATH=src timeout 300 python3 -m pytest -q "tests/gpu/test_cuda_collectives.py::test_bitwise_equal_to_nccl" \
    "tests/gpu/test_cuda_collectives.py::test_profiler_shows_no_kernel" tests/gpu/test_gpu_all_reduce.py tests/gpu/test_gpu_graphs.py \
    tests/gpu/test_gpu_eager_path.py tests/gpu/test_gpu_persistent.py tests/gpu/test_gpu_fsdp.py > $R/gpu.log 2>&1
echo "gpu exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu.log; grep "FAILED\|^E " $R/gpu.log | head -8
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout $((585 - (SECONDS - t0))) python3 -m pytest -q tests/rig -k "eager-w2 or persistent-w2 or graph-w2 or eager-w3 or fsdp-w2" > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $R/rig.log; grep "FAILED\|^E " $R/rig.log | head -5
tar -C $OUT -czf $OUT/run3.tgz r
