#!/usr/bin/env bash
# Issue 38 item 4, final form: settled graphs only for calls on peer-reachable tensors (run3 and
# the copy-kinds probe: a graph replayed copies of plain tensors' calls as SM kernels). The GPU
# test; bench.latency (symmetric tensors, push and pull; graphs off and on, in turns) with phases;
# the rig's eager, persistent and graph parts at world 2.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session7/run4.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}
R=$OUT/r; mkdir -p $R
t0=$SECONDS
PYTHONPATH=src timeout 100 python3 -m pytest -q -s tests/gpu/test_gpu_settled_graph.py > $R/gpu_settled.log 2>&1
echo "settled test exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu_settled.log; grep "FAILED\|^E " $R/gpu_settled.log | head -6
LAT="--impls conccl_symm_pull,conccl_symm_push,nccl --collectives all_gather,reduce_scatter,all_to_all,all_reduce --sizes 4096,65536,1048576 -n 200 --reps 5 --phases"
CONCCL_SETTLED_GRAPHS=0 PYTHONPATH=src timeout 120 python3 -m conccl.bench.latency --out $R/lat_off $LAT > $R/lat_off.log 2>&1
echo "off exit $? at $((SECONDS-t0)) s"
PYTHONPATH=src timeout 120 python3 -m conccl.bench.latency --out $R/lat_on $LAT > $R/lat_on.log 2>&1
echo "on exit $? at $((SECONDS-t0)) s"
for f in lat_off lat_on; do echo "== $f"; grep "^| all\|^| reduce" $R/$f/latency.md | cut -d'|' -f2-9 | head -36; done
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 120 python3 -m pytest -q tests/rig -k "eager-w2 or persistent-w2 or graph-w2" > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $R/rig.log
tar -C $OUT -czf $OUT/run4.tgz r
