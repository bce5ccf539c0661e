#!/usr/bin/env bash
# Session 16, run3: (1) host time of eager calls that set_eager_path("auto") routes to NCCL,
# by layer, against NCCL's own call (auto_host.py); (2) issue 40's missed goal, FSDP2 mixed
# precision at 8192 tokens, `direct=True` with step_and_prefetch against no communication, in
# four invocations alternating the configs' order (the whole iteration timed, no profile),
# then the second shape (d 5120, ffn 13824, 40 heads, 6 blocks) once.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h100x2-session16/run3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=nvidia-h100-x2
OUT=${OUT:?}; R=$OUT/run3; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
OUT=$R PYTHONPATH=src timeout 90 torchrun --nproc-per-node 2 benchmarks/2026-11-27-h100x2-session16/auto_host.py \
    > $R/auto_host.log 2>&1
echo "auto_host exit $? at $((SECONDS-t0)) s"; grep -v "Warning\|warn" $R/auto_host.log | grep "ratio\|micro" | cut -c1-240
for turn in 1 2 3 4; do
  cfg=no_comm,conccl_direct_prefetch; [ $((turn % 2)) = 0 ] && cfg=conccl_direct_prefetch,no_comm
  PYTHONPATH=src timeout 110 python3 -m conccl bench fsdp --out $R/mp8192_$turn --configs $cfg --tokens 8192 \
      --mixed-precision --train-steps 12 --warmup 3 --no-deterministic-loss --no-profile \
      --machine-kind $CONCCL_MACHINE_KIND > $R/mp8192_$turn.log 2>&1
  echo "mp8192 turn $turn ($cfg) exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $R/mp8192_$turn/fsdp.md | cut -d'|' -f2-10
done
left=$((570 - (SECONDS - t0)))
[ $left -gt 60 ] && { PYTHONPATH=src timeout $left python3 -m conccl bench fsdp --out $R/shape2_mp8192 \
    --configs no_comm,conccl_direct_prefetch --tokens 8192 --mixed-precision --train-steps 12 --warmup 3 \
    --no-deterministic-loss --no-profile --dim 5120 --ffn 13824 --heads 40 --layers 6 \
    --machine-kind $CONCCL_MACHINE_KIND > $R/shape2_mp8192.log 2>&1
  echo "shape2 exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $R/shape2_mp8192/fsdp.md | cut -d'|' -f2-10; }
cd $OUT && tar czf run3.tgz run3 && rm -rf run3
