#!/usr/bin/env bash
# Session 17, run10: at equal bytes and duty, does the clock's cost fall with fewer, longer bursts
# over NVLink? (run8: it grew with how often the link carried traffic.) Pulls of 384 MiB every 10
# GEMMs, 1536 MiB every 40, 3072 MiB every 80: the same 7.6% of the time on the link.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h200x2-session17/run10.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
: "${CONCCL_COMMIT:?pass the commit that runs, e.g. CONCCL_COMMIT=$(git rev-parse --short HEAD)}"
OUT=${OUT:?}; R=$OUT/run10; t0=$SECONDS
D=benchmarks/2026-11-27-h200x2-session17
mkdir -p $R; nvidia-smi -L > $R/gpus.txt
for spec in 10:384 40:1536 80:3072 10:384; do
  every=${spec%:*}; mib=${spec#*:}; dir=$R/e${every}_${mib}_$SECONDS; mkdir -p $dir
  PYTHONPATH=src timeout 90 python3 $D/power_probe.py --out $dir --every $every --copy-mib $mib \
      --gemms 1600 --modes alone,pull > $dir.log 2>&1
  echo "every $every x $mib MiB exit $? at $((SECONDS-t0)) s"
done
python3 $D/probe_clocks.py $R/e*/ > $R/clocks.md 2>&1
grep -h "pull" $R/clocks.md; cd $OUT && tar czf run10.tgz run10 && rm -rf run10
