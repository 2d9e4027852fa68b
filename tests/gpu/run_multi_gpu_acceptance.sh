#!/usr/bin/env bash
# Issue 14 acceptance on two H200s of one host (nvidia-h200-x2), all in one device call (under 10 minutes):
# the multi_gpu(2) tests of tests/gpu/test_multi_gpu.py one by one (T=2 dropout 0, DP=2 distributed optimizer
# and overlap_grad_reduce, P=2, T=2 sequence parallel, T=2 dropout 0.1), a diff started by the user's torchrun,
# and the step-time table from the reports the tests kept. Logs, reports and the table go under $OUT as each
# part finishes; summary.txt has one line per part; ps_after.txt shows what was left running.
#   source .whl/gpu-env.sh && bash tests/gpu/run_multi_gpu_acceptance.sh
set -u
out=${OUT:-/tmp/gd-multi-gpu}
mkdir -p "$out/reports"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export GD_REPORT_DIR="$out/reports"
export GD_MULTI_GPU_TIMEOUT_S=${GD_MULTI_GPU_TIMEOUT_S:-120}
budget=${GD_BUDGET_S:-560}
begin=$SECONDS
left() { echo $(( budget - (SECONDS - begin) )); }
limit() { local want=$1 rest; rest=$(left); [ "$rest" -lt "$want" ] && want=$rest; echo "$want"; }
note() { echo "$*" | tee -a "$out/summary.txt"; }
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv; nvidia-smi topo -m; } > "$out/gpus.txt" 2>&1
python -c "import torch, megatron.core as m; print(torch.__version__, m.__version__, torch.cuda.device_count())" \
    > "$out/versions.txt" 2>&1
tests() {  # name, -k expression, seconds
    local secs; secs=$(limit "$3")
    if [ "$secs" -lt 30 ]; then note "pytest $1: not run (budget spent)"; return; fi
    local start=$SECONDS
    timeout -k 10 "$secs" python -m pytest -q -rA -p no:cacheprovider -p no:randomly tests/gpu/test_multi_gpu.py \
        -k "$2" > "$out/pytest_$1.log" 2>&1
    note "pytest $1: exit $? wall $((SECONDS - start)) s: $(tail -1 "$out/pytest_$1.log")"
}
tests tp2_dropout0 "tensor_parallel_local_and_full_iteration" 150
tests dp2_distopt_overlap "data_parallel" 90
tests pp2 "pipeline_parallel" 90
tests tp2_sp "sequence_parallel" 90
tests tp2_dropout0.1 "dropout_follows" 200
secs=$(limit 90)
if [ "$secs" -ge 40 ]; then
    start=$SECONDS
    timeout -k 10 "$secs" python -m torch.distributed.run --standalone --nproc-per-node 2 -m graphdoctor diff \
        --impl local --dropout 0 --tensor-model-parallel-size 2 --num-layers 2 --steps 5 --no-launches \
        --timeout 60 -q --json "$out/torchrun_tp2.json" > "$out/torchrun_tp2.txt" 2>&1
    note "torchrun -m graphdoctor diff (T=2): exit $? wall $((SECONDS - start)) s"
else
    note "torchrun -m graphdoctor diff: not run (budget spent)"
fi
python tests/benchmarks/multi_gpu_table.py --out "$out/table" --from-reports "$out/reports" > "$out/table.log" 2>&1
note "table: exit $? ($out/table/table.md)"
ps -eo pid,ppid,etimes,args | grep -E "graphdoctor|torch.distributed" | grep -v grep > "$out/ps_after.txt"
note "left running: $(wc -l < "$out/ps_after.txt") processes (ps_after.txt); total $((SECONDS - begin)) s"
cat "$out/table/table.md" 2>/dev/null
