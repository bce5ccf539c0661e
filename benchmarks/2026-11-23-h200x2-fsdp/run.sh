#!/usr/bin/env bash
# How this folder's files were made, and what the next 2-GPU session runs (nvidia-h200-x2, from
# the repository root, PYTHONPATH=src). OUT: where to write; PART picks a step (each < 10 min):
#   1  GPU tests: all-reduce, reduce-scatter, captured graphs, the eager path's routing, FSDP
#   2  `conccl bench` of reduce-scatter and all-reduce (nccl-tests columns, a GEMM beside each),
#      then reduce-scatter again with the reduction's grid at 32 and 132 CTAs (CONCCL_REDUCE_CTAS;
#      the default is now half the SMs, 66: benchmarks/2026-11-23-h200-reduce-beside-gemm)
#   3  `conccl bench fsdp`
#   4  `conccl bench graphs` (issue 22's small-call benchmark: graphs.json, graphs.md, graphs.log)
#   5  the GPU test of that benchmark (a tiny run) and the fault soak (now with reductions)
#   6  the whole `conccl study` on 2 GPUs (issue 21's GPU report), as study.tgz (a run returns
#      at most 8 files)
#   7  a quick study of reduce-scatter and all-reduce beside one GEMM (issue 20), as a .tgz
# (first-6908cfa/ ran the FSDP test and bench only, with no all-reduce yet and the loss from
# the timed run.)
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/src CONCCL_MACHINE_KIND=nvidia-h200-x2
OUT=${OUT:?}
case "${PART:-1}" in
1) timeout 500 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_gpu_all_reduce.py \
     tests/gpu/test_gpu_reduce_scatter.py tests/gpu/test_gpu_graphs.py tests/gpu/test_gpu_eager_path.py \
     tests/gpu/test_gpu_fsdp.py \
     > $OUT/gpu_tests.log 2>&1
   grep -E "passed|failed|Error" $OUT/gpu_tests.log | tail -6 ;;
2) for c in reduce_scatter all_reduce; do
     timeout 250 python3 -m conccl bench -b 64M -e 1G --collective $c --impl conccl,conccl_symm_push,nccl \
       --json $OUT/bench_$c.json --markdown $OUT/bench_$c.md > $OUT/bench_$c.log 2>&1; tail -4 $OUT/bench_$c.log
   done
   for g in 32 132; do
     CONCCL_REDUCE_CTAS=$g timeout 100 python3 -m conccl bench -b 256M -e 1G --collective reduce_scatter \
       --impl conccl --json $OUT/bench_rs_ctas$g.json > $OUT/bench_rs_ctas$g.log 2>&1; tail -3 $OUT/bench_rs_ctas$g.log
   done ;;
3) timeout 560 python3 -m conccl bench fsdp --out $OUT > $OUT/bench_fsdp.log 2>&1
   grep "^|" $OUT/bench_fsdp.log | head -9 ;;
4) timeout 560 python3 -m conccl bench graphs --out $OUT --impls nccl,conccl,conccl_auto > $OUT/graphs.log 2>&1
   echo "exit $?"; grep -A12 "^## Goals" $OUT/graphs.md; grep -c error $OUT/graphs.log ;;
5) timeout 400 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_gpu_bench_graphs.py \
     tests/gpu/test_gpu_faults.py::test_soak_mixed_calls_no_wrong_value_no_growth \
     > $OUT/gpu_test_graphs.log 2>&1
   grep -E "passed|failed|Error" $OUT/gpu_test_graphs.log | tail -6 ;;
6) rm -rf /tmp/study; timeout 560 python3 -m conccl study --out /tmp/study > $OUT/study.log 2>&1
   echo "exit $?"; tail -15 $OUT/study.log; tar czf $OUT/study.tgz -C /tmp study ;;
7) for c in reduce_scatter all_reduce; do
     rm -rf /tmp/study_$c; timeout 270 python3 -m conccl study --quick --gemm 8192x8192x8192 --collective $c \
       --size 256M --out /tmp/study_$c > $OUT/study_$c.log 2>&1; echo "$c exit $?"; tail -6 $OUT/study_$c.log
   done; tar czf $OUT/study_reducing.tgz -C /tmp study_reduce_scatter study_all_reduce ;;
esac
