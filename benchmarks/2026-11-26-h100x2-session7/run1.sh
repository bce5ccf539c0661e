#!/usr/bin/env bash
# Issue 38 item 4 (eager host time): the compiled programs' driver calls through ctypes
# (conccl/executors/cuda_fastcall.py) and the board's per-call path without numpy reductions.
# 1. driver_call_probe: each driver call's host time, cuda-python against ctypes (one GPU);
# 2. GPU tests: the fast calls, the collectives against NCCL bit for bit, graphs;
# 3. bench.latency --phases, in turns: the tree before (.old/src, 8545b4c), this tree with
#    cuda-python's calls (CONCCL_DRIVER_CALLS=cuda-python), this tree as shipped;
# 4. the shared-GPU rig's eager and graph parts at world 2; 5. issue 39's op bench again.
#   git archive 8545b4c src | tar -x -C .old   (untracked, carried to the device)
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session7/run1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
R=$OUT/r; mkdir -p $R
t0=$SECONDS
PYTHONPATH=src timeout 90 python3 scripts/driver_call_probe.py --json $R/probe.json > $R/probe.log 2>&1
echo "probe exit $? at $((SECONDS-t0)) s"; cat $R/probe.log | tail -12
PYTHONPATH=src timeout 240 python3 -m pytest -q tests/gpu/test_gpu_fastcall.py \
    "tests/gpu/test_cuda_collectives.py::test_bitwise_equal_to_nccl" "tests/gpu/test_cuda_collectives.py::test_profiler_shows_no_kernel" \
    tests/gpu/test_gpu_all_reduce.py tests/gpu/test_gpu_graphs.py tests/gpu/test_gpu_eager_path.py > $R/gpu.log 2>&1
echo "gpu exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu.log; grep "FAILED\|^E " $R/gpu.log | head -8
LAT="--impls conccl,nccl --collectives all_gather,reduce_scatter --sizes 4096,65536,1048576 -n 200 --reps 5 --phases"
for rep in 1 2; do
  PYTHONPATH=.old/src timeout 100 python3 -m conccl.bench.latency --out $R/lat_old$rep $LAT > $R/lat_old$rep.log 2>&1
  echo "old exit $? at $((SECONDS-t0)) s"
  CONCCL_DRIVER_CALLS=cuda-python PYTHONPATH=src timeout 100 python3 -m conccl.bench.latency --out $R/lat_cp$rep $LAT > $R/lat_cp$rep.log 2>&1
  echo "cuda-python exit $? at $((SECONDS-t0)) s"
  PYTHONPATH=src timeout 100 python3 -m conccl.bench.latency --out $R/lat_new$rep $LAT > $R/lat_new$rep.log 2>&1
  echo "new exit $? at $((SECONDS-t0)) s"
done
for f in lat_old1 lat_cp1 lat_new1 lat_old2 lat_cp2 lat_new2; do echo "== $f"; grep "^| all_gather\|^| reduce_scatter" $R/$f/latency.md | cut -d'|' -f2-9; done
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout $((570 - (SECONDS - t0))) python3 -m pytest -q tests/rig -k "eager-w2 or graph-w2" > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $R/rig.log
# issue 39: the op bench once more (with session 6's run8, the H100's two-GPU pipelines table)
PYTHONPATH=src timeout $((590 - (SECONDS - t0))) python3 -m conccl bench tp --out $R/ops --impls gemm_only,torch_async_tp,conccl,conccl_auto \
    --machine-kind $CONCCL_MACHINE_KIND > $R/ops.log 2>&1
echo "ops exit $? at $((SECONDS-t0)) s"
tar -C $OUT -czf $OUT/run1.tgz r
