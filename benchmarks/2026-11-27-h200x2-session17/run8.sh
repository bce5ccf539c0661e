#!/usr/bin/env bash
# Session 17, run8: what about a copy lowers the power-capped SM clock (run7: a 384 MiB pull every
# 10 or 40 GEMMs cost the GEMMs 1-4%, those apart from the copies too)? Pull, push and within-GPU
# copies; a copy every ~200 ms; small copies (32 MiB) as often as run7's.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h200x2-session17/run8.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
: "${CONCCL_COMMIT:?pass the commit that runs, e.g. CONCCL_COMMIT=$(git rev-parse --short HEAD)}"
OUT=${OUT:?}; R=$OUT/run8; t0=$SECONDS
D=benchmarks/2026-11-27-h200x2-session17
mkdir -p $R/kinds $R/sparse $R/small
nvidia-smi -L > $R/gpus.txt
PYTHONPATH=src timeout 150 python3 $D/power_probe.py --out $R/kinds --every 10 --modes alone,pull,push,local > $R/kinds.log 2>&1
echo "kinds exit $? at $((SECONDS-t0)) s"
PYTHONPATH=src timeout 90 python3 $D/power_probe.py --out $R/sparse --every 150 --modes alone,pull > $R/sparse.log 2>&1
echo "sparse exit $? at $((SECONDS-t0)) s"
PYTHONPATH=src timeout 90 python3 $D/power_probe.py --out $R/small --every 10 --copy-mib 32 --modes alone,pull > $R/small.log 2>&1
echo "small exit $? at $((SECONDS-t0)) s"
python3 $D/probe_clocks.py $R/kinds $R/sparse $R/small > $R/clocks.md 2>&1; cat $R/clocks.md
cd $OUT && tar czf run8.tgz run8 && rm -rf run8
