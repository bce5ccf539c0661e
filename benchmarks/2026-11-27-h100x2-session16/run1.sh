#!/usr/bin/env bash
# Session 16, run1: what session 15 left un-run on a GPU (the mark-word refresh and its GPU
# test, release()'s int32 fill, the shared queue_captured of settled and user-captured
# pipelines), then the README's set-up and main job exactly as a newcomer types them.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-27-h100x2-session16/run1.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:?}; R=$OUT/run1; mkdir -p $R
t0=$SECONDS
nvidia-smi -L > $R/gpus.txt
python3 -c "import torch, torch.cuda.nccl as n; print(torch.__version__, n.version())" > $R/versions.txt 2>&1
PYTHONPATH=src timeout 200 python3 -m pytest -q tests/gpu/test_gpu_tp.py tests/gpu/test_gpu_settled_graph.py \
    tests/gpu/test_gpu_graphs.py > $R/gpu_tests.log 2>&1
echo "gpu tests exit $? at $((SECONDS-t0)) s: $(tail -1 $R/gpu_tests.log)"
CONCCL_RIG_TIMEOUT=100 CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 130 python3 -m pytest -q tests/rig \
    -k "tp-w2 or graph-w2" > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s: $(tail -1 $R/rig.log)"
# the README's set-up and main job, as typed (the study writes into ./study)
timeout 60 python3 scripts/setup_env.py > $R/setup.log 2>&1
echo "setup exit $? at $((SECONDS-t0)) s: $(tail -1 $R/setup.log)"
left=$((570 - (SECONDS - t0)))
PYTHONPATH=src timeout $left python3 -m conccl study --out study > $R/study.log 2>&1
echo "study exit $? at $((SECONDS-t0)) s"; tail -4 $R/study.log
cp -r study $R/study 2>/dev/null
cd $OUT && tar czf run1.tgz run1 && rm -rf run1
