#!/usr/bin/env bash
# Issue 38, eager `auto`: the reductions' eager sweep added to run1's study (the README's main job
# of this session) by resuming it with this tree (only the missing steps run: the eager sweep of
# reduce_scatter and all_reduce); the GPU tests of the study (four collectives' eager sweep) and
# of the eager path; every collective eager with set_eager_path("auto") planned from the resumed
# study's profile (CONCCL_PROFILE), two turns; the routed call's layers in turns.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session11/run2.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run2; mkdir -p $R; D=benchmarks/2026-11-26-h100x2-session11
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
rm -rf $R/study && cp -r $D/run1/study $R/study
python3 -c "import json,sys; p=sys.argv[1]; d=json.load(open(p)); d['complete']=False; json.dump(d, open(p,'w'))" $R/study/results.json
PYTHONPATH=src timeout 200 python3 -m conccl study --resume --out $R/study > $R/study.log 2>&1
echo "resume exit $? at $((SECONDS-t0)) s"; tail -4 $R/study.log
PYTHONPATH=src timeout 240 python3 -m pytest -q -s tests/gpu/test_gpu_study.py tests/gpu/test_gpu_eager_path.py > $R/gpu.log 2>&1
echo "tests exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu.log; grep "^FAILED\|^E " $R/gpu.log | head -8
B="--modes eager --sizes 4K,64K,1M,4M,16M,64M,256M --impls nccl,conccl,conccl_auto"
for turn in 1 2; do
  CONCCL_PROFILE=$R/study/profile.json PYTHONPATH=src timeout 100 python3 -m conccl bench graphs $B --out $R/eager$turn \
    > $R/eager$turn.log 2>&1
  echo "eager$turn exit $? at $((SECONDS-t0)) s"
done
for s in 4096 1048576; do
  PYTHONPATH=src timeout 60 python3 $D/route_turns.py $s > $R/route_turns_$s.txt 2>&1
  echo "route $s exit $? at $((SECONDS-t0)) s"
done
tar -C $OUT -czf $OUT/run2.tgz run2
