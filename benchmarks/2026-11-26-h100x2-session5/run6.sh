#!/usr/bin/env bash
# Issue 38 item 5: conccl.tp captured into CUDA graphs. GPU tests (tp with the captured case,
# the flat collectives' graphs: the pad's layout changed), the rig's tp (with its captured case),
# graph and eager parts, bench tp at decode size eager and --graph, and bench tp --profile (the
# profile flow fixed after run4) with plan tp reading it. One archive back.
#   OUT=<folder> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-26-h100x2-session5/run6.sh
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
R=$OUT/r; mkdir -p $R
t0=$SECONDS
PYTHONPATH=src timeout 200 python3 -m pytest -q tests/gpu/test_gpu_tp.py tests/gpu/test_gpu_graphs.py \
    tests/gpu/test_gpu_tp_compile.py > $R/gpu.log 2>&1
echo "gpu exit $? at $((SECONDS-t0)) s"; tail -1 $R/gpu.log; grep "FAILED\|ERROR\|Error" $R/gpu.log | head -8
CUDA_VISIBLE_DEVICES=0 PYTHONPATH=src timeout 120 python3 -m pytest -q tests/rig -k "tp-w2 or tp-w3 or graph-w2 or eager-w2" \
    > $R/rig.log 2>&1
echo "rig exit $? at $((SECONDS-t0)) s"; tail -1 $R/rig.log; grep -i "failed\|rank" $R/rig.log | head -8
for mode in eager graph; do
  flag=""; [ $mode = graph ] && flag="--graph"
  PYTHONPATH=src timeout 120 python3 -m conccl bench tp --out $R/decode_$mode $flag --shapes 1024x8192x7168,1024x3584x8192 \
      --schedules serial,direct,direct-p2 --machine-kind $CONCCL_MACHINE_KIND > $R/decode_$mode.log 2>&1
  echo "decode $mode exit $? at $((SECONDS-t0)) s"; grep "^| ag_gemm | 1024x8192\|^| gemm_rs | 1024x3584" $R/decode_$mode/tp.md | cut -d'|' -f2-10
done
if nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H200; then
  cp src/conccl/data/h200x4_profile.json $R/profile.json; gpu=H200
else
  cp src/conccl/data/h100x2_profile.json $R/profile.json; gpu=H100
fi
PYTHONPATH=src timeout 120 python3 -m conccl bench tp --out $R/keep --ops ag_gemm --shapes 8192x8192x7168,4096x8192x8192 \
    --schedules direct,direct-p2 --profile $R/profile.json --machine-kind $CONCCL_MACHINE_KIND > $R/keep.log 2>&1
echo "bench tp --profile exit $? at $((SECONDS-t0)) s"; tail -2 $R/keep.log
PYTHONPATH=src python3 -m conccl plan tp --shape 4096x8192x8192 --world 2 --profile $R/profile.json --gpu $gpu 2>&1 | head -3
tar -C $OUT -czf $OUT/run6.tgz r && rm -rf $R
