#!/usr/bin/env bash
# Issue 37 on nvidia-h100-x2 (and nvidia-h100-x1 / nvidia-h200 for PART one): the README's
# commands as a newcomer types them, from the repository root.
#   OUT=<folder> PART=<study|tests|one> bash benchmarks/2026-11-25-h100x2-newcomer/run.sh
#   study  the README's main job (`conccl study --out study`, every default scenario); its
#          profile.json installed as the shipped H100 profile in this copy; then the README's
#          first example under torchrun and `bench graphs --impls nccl,conccl,conccl_auto`
#   tests  the README's test command, then the full GPU tier's command
#   one    one GPU: the main job (a one-GPU study) and the test command
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
t0=$SECONDS
{ nvidia-smi -L; nvidia-smi topo -m; python3 -c "import torch; print(torch.__version__, torch.cuda.nccl.version(), torch.cuda.device_count())"; } > $OUT/env.txt 2>&1
readme_block() {  # the python block after the README heading "$1"
  awk -v h="$1" '$0 == h {f=1} f && /^```python/ {p=1; next} p && /^```/ {exit} p' README.md
}
case "${PART:-study}" in
study)
  rm -rf study
  timeout 420 env PYTHONPATH=src python3 -m conccl study --out study > $OUT/study.log 2>&1
  echo "study exit $? at $((SECONDS-t0)) s"; grep -v "^#" $OUT/study.log | tail -22
  [ -f study/profile.json ] && cp study/profile.json src/conccl/data/h100x2_profile.json
  tar czf $OUT/study.tgz study
  readme_block "## A first example" > /tmp/first.py
  echo 'print(f"rank {dist.get_rank()}: out ok {bool((out.view(-1, 1 << 20)[:, :1] == out.view(-1, 1 << 20)[:, :1]).all())}, plan {c3.plan.strategy}, profile {conccl.runtime.agreed_profile().note}")' >> /tmp/first.py
  PYTHONPATH=src timeout 90 torchrun --nproc-per-node 2 /tmp/first.py > $OUT/first_example.log 2>&1
  echo "first example exit $? at $((SECONDS-t0)) s"; tail -4 $OUT/first_example.log
  PYTHONPATH=src timeout 100 python3 -m conccl bench graphs --out $OUT/graphs --sizes 4K,64K,1M,16M \
    --collectives all_gather,all_reduce --impls nccl,conccl,conccl_auto --runs 3 > /tmp/graphs.log 2>&1
  echo "bench graphs exit $? at $((SECONDS-t0)) s"; grep -E "profile|^\| (4K|64K|1M|16M)" $OUT/graphs/graphs.md | head -12
  # one GPU visible: the main job as a one-GPU study (what time is left)
  rm -rf study1
  CUDA_VISIBLE_DEVICES=0 timeout $((590-SECONDS+t0)) env PYTHONPATH=src python3 -m conccl study --out study1 > $OUT/study1.log 2>&1
  echo "one-GPU study exit $? at $((SECONDS-t0)) s"; grep -v "^#" $OUT/study1.log | tail -12
  cp /tmp/graphs.log study1/ 2>/dev/null; tar czf $OUT/study1.tgz study1 ;;
tests)
  # the README's test command with one GPU visible (its GPU tier skips) beside the same with two
  # (the CPU tiers hide the GPUs; only the two-GPU run's short GPU part uses them): concurrent,
  # each within 10 minutes as it must be alone
  (CUDA_VISIBLE_DEVICES=0 timeout 560 env PYTHONPATH=src python3 -m pytest -q > $OUT/tests_1gpu.log 2>&1; \
   echo "tests, one GPU visible: exit $? at $((SECONDS-t0)) s") &
  timeout 560 env PYTHONPATH=src python3 -m pytest -q --durations=15 > $OUT/tests.log 2>&1
  echo "tests, two GPUs: exit $? at $((SECONDS-t0)) s"; wait
  tail -3 $OUT/tests_1gpu.log; grep -E "passed|failed|^FAILED|^ERROR" $OUT/tests.log | tail -8
  # the whole GPU tier, as far as the time goes
  timeout $((590-SECONDS+t0)) env PYTHONPATH=src python3 -m pytest -q tests/gpu --durations=25 > $OUT/tests_gpu.log 2>&1
  echo "GPU tier exit $? at $((SECONDS-t0)) s"; grep -E "passed|failed|^FAILED|^ERROR|s call" $OUT/tests_gpu.log | tail -30 ;;
one)
  rm -rf study
  timeout 300 env PYTHONPATH=src python3 -m conccl study --out study > $OUT/study.log 2>&1
  echo "study exit $? at $((SECONDS-t0)) s"; grep -v "^#" $OUT/study.log | tail -12
  tar czf $OUT/study.tgz study
  timeout $((590-SECONDS+t0)) env PYTHONPATH=src python3 -m pytest -q -rs > $OUT/tests.log 2>&1
  echo "tests exit $? at $((SECONDS-t0)) s"; tail -12 $OUT/tests.log ;;
esac
