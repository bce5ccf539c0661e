#!/usr/bin/env bash
# The README as a newcomer types it on 2 x H100: its first example (copied from README.md) under
# torchrun, the main job's short form (conccl study --quick); then the mixed-precision 8192-token
# iteration with the reduction kernel on 33 CTAs instead of 66 (CONCCL_REDUCE_CTAS).
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session6/run5.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
mkdir -p $OUT/r
t0=$SECONDS
python3 - > $OUT/r/first.py <<'PY'
import re
text = open("README.md").read()
block = text.split("## A first example", 1)[1].split("```python", 1)[1].split("```", 1)[0]
print(block + "\ntorch.cuda.synchronize(); print('first example ok on rank', dist.get_rank(), y.shape, out.shape)\n"
      "dist.destroy_process_group()")
PY
PYTHONPATH=src timeout 90 torchrun --nproc-per-node 2 $OUT/r/first.py > $OUT/r/first.log 2>&1
echo "first example exit $? at $((SECONDS-t0)) s"; grep "ok on rank\|Error" $OUT/r/first.log | head -4
PYTHONPATH=src timeout 200 python3 -m conccl study --out $OUT/r/study --quick > $OUT/r/study.log 2>&1
echo "study --quick exit $? at $((SECONDS-t0)) s"; tail -3 $OUT/r/study.log; ls $OUT/r/study | head
CONCCL_REDUCE_CTAS=33 PYTHONPATH=src timeout $((540 - (SECONDS - t0))) python3 -m conccl bench fsdp --out $OUT/r/mp8192_ctas33 \
    --no-profile --configs no_comm,conccl_direct_prefetch --tokens 8192 --mixed-precision \
    --train-steps 12 --warmup 3 --no-deterministic-loss --machine-kind $CONCCL_MACHINE_KIND > $OUT/r/mp8192_ctas33.log 2>&1
echo "bench ctas33 exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/r/mp8192_ctas33/fsdp.md | cut -d'|' -f2-10
rm -rf $OUT/r/study/figures
tar -C $OUT -czf $OUT/run5.tgz r
