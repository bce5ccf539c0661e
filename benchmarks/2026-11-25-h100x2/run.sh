#!/usr/bin/env bash
# The first session with two GPUs of one host lent since 2026-11-23 (nvidia-h100-x2): the
# measurements that waited in issues 20, 22 and 31. From the repository root:
#   OUT=<folder> PART=<A|B|C> CONCCL_COMMIT=<sha> bash benchmarks/2026-11-25-h100x2/run.sh
#   A  the machine (env.txt), GPU tests of reduce-scatter, all-reduce, FSDP and conccl.tp at
#      world 2, then `conccl bench tp` (issue 31's table)
#   B  `conccl bench fsdp` (issue 20's table)
#   C  `conccl bench` of reduce-scatter and all-reduce against NCCL, graphs and eager-path tests
#   D  after the fixes: the FSDP and eager-path GPU tests again, the new hierarchical GPU test
#      (each GPU a pretend host, NCCL between), the shared-GPU rig's hier (now with persistent
#      ops), fsdp_hosts and hier_faults parts on GPU 0, then a short `conccl bench graphs`
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/src CONCCL_MACHINE_KIND=${CONCCL_MACHINE_KIND:-nvidia-h100-x2}
OUT=${OUT:?}
KIND=$CONCCL_MACHINE_KIND
t0=$SECONDS
case "${PART:-A}" in
A) { nvidia-smi -L; nvidia-smi topo -m; python3 -c "import torch; print(torch.__version__, torch.cuda.nccl.version(), torch.cuda.device_count())"; } > $OUT/env.txt 2>&1
   timeout 280 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_gpu_reduce_scatter.py \
     tests/gpu/test_gpu_all_reduce.py tests/gpu/test_gpu_fsdp.py tests/gpu/test_gpu_tp.py > $OUT/gpu_tests.log 2>&1
   echo "tests exit $? at $((SECONDS-t0)) s"; grep -E "passed|failed|Error" $OUT/gpu_tests.log | tail -8
   timeout $((570-SECONDS+t0)) python3 -m conccl bench tp --out $OUT --machine-kind $KIND > $OUT/bench_tp.log 2>&1
   echo "bench tp exit $? at $((SECONDS-t0)) s"; tail -5 $OUT/bench_tp.log ;;
B) timeout 570 python3 -m conccl bench fsdp --out $OUT --machine-kind $KIND > $OUT/bench_fsdp.log 2>&1
   echo "bench fsdp exit $? at $((SECONDS-t0)) s"; grep "^|" $OUT/bench_fsdp.log | head -12 ;;
C) for c in reduce_scatter all_reduce; do
     timeout 150 python3 -m conccl bench -b 64M -e 1G --collective $c --impl conccl,nccl \
       --json $OUT/bench_$c.json --markdown $OUT/bench_$c.md > $OUT/bench_$c.log 2>&1
     echo "bench $c exit $? at $((SECONDS-t0)) s"; tail -4 $OUT/bench_$c.log
   done
   timeout $((570-SECONDS+t0)) python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_gpu_graphs.py \
     tests/gpu/test_gpu_eager_path.py > $OUT/gpu_tests_graphs.log 2>&1
   echo "tests exit $? at $((SECONDS-t0)) s"; grep -E "passed|failed|Error" $OUT/gpu_tests_graphs.log | tail -6 ;;
D) timeout 260 python3 -m pytest -q -s -p no:cacheprovider tests/gpu/test_gpu_hierarchical.py tests/gpu/test_gpu_eager_path.py \
     tests/gpu/test_gpu_fsdp.py > $OUT/gpu_tests_d.log 2>&1
   echo "tests exit $? at $((SECONDS-t0)) s"; grep -E "passed|failed|Error|right" $OUT/gpu_tests_d.log | tail -8
   CUDA_VISIBLE_DEVICES=0 timeout 150 python3 scripts/shared_gpu_smoke.py --world 4 --only hier,fsdp_hosts \
     --json $OUT/rig_w4_hier.json > $OUT/rig_w4_hier.log 2>&1; echo "rig exit $? at $((SECONDS-t0)) s"; tail -4 $OUT/rig_w4_hier.log
   CUDA_VISIBLE_DEVICES=0 timeout 90 python3 scripts/shared_gpu_smoke.py --world 4 --only hier_faults \
     --json $OUT/rig_w4_faults.json > $OUT/rig_w4_faults.log 2>&1; echo "rig faults exit $? at $((SECONDS-t0)) s"; tail -6 $OUT/rig_w4_faults.log
   timeout $((575-SECONDS+t0)) python3 -m conccl bench graphs --out $OUT --sizes 4K,64K,1M,16M --collectives all_gather,all_reduce \
     --machine-kind $KIND > $OUT/graphs.log 2>&1; echo "graphs exit $? at $((SECONDS-t0)) s"; grep -A12 "^## Goals" $OUT/graphs.md | head -14 ;;
esac
