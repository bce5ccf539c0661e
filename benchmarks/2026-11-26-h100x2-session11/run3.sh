#!/usr/bin/env bash
# After the review: (1) run2's study with its eager sweep dropped, resumed (a finished study from
# before the eager sweep now gets only that: the all-reduce timed in place, the sweep run last);
# (2) the GPU tests of the eager path (a routed call marks its end at once again), the
# collectives and the quick study; (3) the shared-GPU rig's eager part (now with a routed
# all-reduce on one stream, then a copy-engine all-gather on another reading its result) at
# worlds 2 and 3; (4) every collective eager with `auto` planned from (1)'s profile, one turn.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session11/run3.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run3; mkdir -p $R; D=benchmarks/2026-11-26-h100x2-session11
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
rm -rf $R/study && cp -r $D/run2/study $R/study
python3 -c "import json,sys; p=sys.argv[1]; d=json.load(open(p)); d['eager_sizes']=[]; d['schema']='conccl-study-results/4'; json.dump(d, open(p,'w'))" $R/study/results.json
PYTHONPATH=src timeout 150 python3 -m conccl study --resume --out $R/study > $R/study.log 2>&1
echo "resume exit $? at $((SECONDS-t0)) s"; tail -2 $R/study.log
PYTHONPATH=src timeout 240 python3 -m pytest -q -s tests/gpu/test_gpu_eager_path.py tests/gpu/test_cuda_collectives.py \
  tests/gpu/test_gpu_study.py > $R/gpu.log 2>&1
echo "gpu exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu.log; grep "^FAILED\|^E " $R/gpu.log | head -8
CONCCL_PROFILE=$R/study/profile.json PYTHONPATH=src timeout 60 python3 -m conccl bench graphs --modes eager \
  --sizes 4K,64K,1M,4M,16M,64M,256M --impls nccl,conccl,conccl_auto --out $R/eager1 > $R/eager1.log 2>&1
echo "eager1 exit $? at $((SECONDS-t0)) s"
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout $((540 - (SECONDS - t0))) python3 -m pytest -q tests/rig \
  -k "eager-w2 or eager-w3" > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $R/rig.log; grep "^FAILED\|^E " $R/rig.log | head -12
tar -C $OUT -czf $OUT/run3.tgz run3
