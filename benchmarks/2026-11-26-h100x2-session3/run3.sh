#!/usr/bin/env bash
# Third run: issue 40's second model shape (d 5120, ffn 13824, 40 heads, 6 blocks: 1.90 B
# parameters), bf16, every goal's figures; then what the reduction's grid costs the 8192-token
# step beside the GEMMs (CONCCL_REDUCE_CTAS: 66 default with the profiled step, 16, 132).
#   OUT=<folder> bash benchmarks/2026-11-26-h100x2-session3/run3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
PYTHONPATH=src timeout 260 python3 -m conccl bench fsdp --out $OUT/shape2 --configs no_comm,stock,conccl_direct \
    --dim 5120 --ffn 13824 --heads 40 --layers 6 --train-steps 10 --warmup 3 --no-profile \
    --machine-kind $CONCCL_MACHINE_KIND > $OUT/shape2.log 2>&1
echo "shape2 exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/shape2/fsdp.md
grep -o "^[a-z_]*, [0-9]* tokens\|[0-9]* copy-engine programs compiled\|host queued a step's forward and backward in [0-9.]* ms" $OUT/shape2/fsdp.md
for ctas in 66 16 132; do
  prof=--no-profile; [ $ctas = 66 ] && prof=
  CONCCL_REDUCE_CTAS=$ctas PYTHONPATH=src timeout 110 python3 -m conccl bench fsdp --out $OUT/ctas$ctas --configs no_comm,conccl_direct \
      --tokens 8192 --train-steps 10 --warmup 3 $prof --no-deterministic-loss --machine-kind $CONCCL_MACHINE_KIND > $OUT/ctas$ctas.log 2>&1
  echo "ctas $ctas exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/ctas$ctas/fsdp.md | cut -d'|' -f2-6
done
