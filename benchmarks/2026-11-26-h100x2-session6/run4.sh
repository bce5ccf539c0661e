#!/usr/bin/env bash
# The second model shape (d 5120, ffn 13824, 40 heads, 6 blocks: 1.90 B) bf16 and mixed precision
# at 2048 and 8192 tokens, then the default model under mixed precision at 2048 tokens: no_comm,
# stock, conccl_direct_prefetch; the whole iteration timed, memory by the driver.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session6/run4.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
mkdir -p $OUT/r
t0=$SECONDS
S2="--dim 5120 --ffn 13824 --heads 40 --layers 6"
for mp in "" "--mixed-precision"; do
  name=shape2${mp:+_mp}
  PYTHONPATH=src timeout 200 python3 -m conccl bench fsdp --out $OUT/r/$name --no-profile $S2 $mp \
      --configs no_comm,stock,conccl_direct_prefetch --tokens 2048,8192 \
      --train-steps 12 --warmup 3 --no-deterministic-loss --machine-kind $CONCCL_MACHINE_KIND > $OUT/r/$name.log 2>&1
  echo "bench $name exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/r/$name/fsdp.md | cut -d'|' -f2-13
done
PYTHONPATH=src timeout $((560 - (SECONDS - t0))) python3 -m conccl bench fsdp --out $OUT/r/mp2048 --no-profile \
    --configs no_comm,stock,conccl_direct_prefetch --tokens 2048 --mixed-precision \
    --train-steps 12 --warmup 3 --no-deterministic-loss --machine-kind $CONCCL_MACHINE_KIND > $OUT/r/mp2048.log 2>&1
echo "bench mp2048 exit $? at $((SECONDS-t0)) s"; grep "^| [0-9]" $OUT/r/mp2048/fsdp.md | cut -d'|' -f2-13
tar -C $OUT -czf $OUT/run4.tgz r
