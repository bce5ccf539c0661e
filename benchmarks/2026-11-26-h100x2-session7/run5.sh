#!/usr/bin/env bash
# run4's latency part again (its bench refused reduce-scatter's symmetric input: the arena was
# sized by output bytes; fixed): symmetric tensors, graphs off and on, in turns.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}
R=$OUT/r; mkdir -p $R
LAT="--impls conccl_symm_pull,conccl_symm_push,nccl --collectives all_gather,reduce_scatter,all_to_all,all_reduce --sizes 4096,65536,1048576 -n 200 --reps 5 --phases"
CONCCL_SETTLED_GRAPHS=0 PYTHONPATH=src timeout 100 python3 -m conccl.bench.latency --out $R/lat_off $LAT > $R/lat_off.log 2>&1; echo "off exit $?"
PYTHONPATH=src timeout 100 python3 -m conccl.bench.latency --out $R/lat_on $LAT > $R/lat_on.log 2>&1; echo "on exit $?"
for f in lat_off lat_on; do echo "== $f"; grep "^| all\|^| reduce" $R/$f/latency.md | cut -d'|' -f2-9 | head -36; done
tar -C $OUT -czf $OUT/run5.tgz r
