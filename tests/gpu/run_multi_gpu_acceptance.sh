#!/usr/bin/env bash
# Issue 14 acceptance on two H200s of one host (nvidia-h200-x2), in parts, one device call each (10-minute
# limit; each part is budgeted under 560 s):
#   a   T=2 dropout 0 (local, full_iteration), DP=2 distributed optimizer + overlap_grad_reduce, P=2 (a mask per
#       microbatch), and P=2 with one mask for every microbatch (planted: fails in Megatron's graph creation)
#   b   T=2 dropout 0.1, the planted rank-0 all-reduce hang (tests/gpu/test_hang_gpu.py), a diff started by
#       the user's torchrun
#   c   issue 20's exits (tests/gpu/test_hang_gpu.py): the planted graph kept past training is a teardown-hang
#       (GD516) with both ranks' stacks; T=2 with evaluation exits cleanly
#   te  T=2 sequence parallel with the TE layer spec (needs Transformer Engine staged: source .whl/te-env.sh)
#   ep  expert parallel 2 on the MoE run files: dropless alltoall and allgather under the TE scopes
#       attn,moe_router,moe_preprocess, drop-and-pad under the TE `moe` scope (those need Transformer Engine
#       staged), and dropless `local` whole layers (capture-failed, GD217; with or without Transformer Engine)
# Every part ends with the step-time table of every report under $OUT/reports and ps_after.txt (what was
# left running). Logs and reports go under $OUT as each step finishes; summary.txt has one line per step.
# Parts joined by + run one after the other in one call, under one budget (a step the budget cannot hold
# says "not run (budget spent)"): `a+b` once the exits are fast.
#   source .whl/gpu-env.sh && [PYTHONPATH=/tmp/te-site:$PYTHONPATH] bash tests/gpu/run_multi_gpu_acceptance.sh a|b|c|te|ep[+...]
set -u
parts=${1:-}
for part in ${parts//+/ }; do
    case "$part" in a|b|c|te|ep) ;; *) echo "usage: $0 a|b|c|te|ep[+...]" >&2; exit 2 ;; esac
done
[ -n "$parts" ] || { echo "usage: $0 a|b|c|te|ep[+...]" >&2; exit 2; }
part=$parts
out=${OUT:-/tmp/gd-multi-gpu}
mkdir -p "$out/reports"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export GD_REPORT_DIR="$out/reports"
export GD_MULTI_GPU_TIMEOUT_S=${GD_MULTI_GPU_TIMEOUT_S:-120}
budget=${GD_BUDGET_S:-560}
begin=$SECONDS
left() { echo $(( budget - (SECONDS - begin) )); }
limit() { local want=$1 rest; rest=$(left); [ "$rest" -lt "$want" ] && want=$rest; echo "$want"; }
note() { echo "$part: $*" | tee -a "$out/summary.txt"; }
{ nvidia-smi --query-gpu=index,name,memory.total --format=csv; nvidia-smi topo -m; } > "$out/gpus.txt" 2>&1
python -c "import torch, megatron.core as m; print(torch.__version__, m.__version__, torch.cuda.device_count())" \
    > "$out/versions.txt" 2>&1
tests() {  # name, test file, -k expression, seconds
    local secs; secs=$(limit "$4")
    if [ "$secs" -lt 30 ]; then note "pytest $1: not run (budget spent)"; return; fi
    local start=$SECONDS
    timeout -k 10 "$secs" python -m pytest -q -rA -s -p no:cacheprovider -p no:randomly "$2" -k "$3" \
        > "$out/pytest_$1.log" 2>&1
    note "pytest $1: exit $? wall $((SECONDS - start)) s (limit $secs): $(tail -1 "$out/pytest_$1.log")"
}
mg=tests/gpu/test_multi_gpu.py
for part in ${parts//+/ }; do
case "$part" in
a)
    tests tp2_dropout0 $mg "tensor_parallel_local_and_full_iteration" 150
    tests dp2_distopt_overlap $mg "data_parallel" 90
    tests pp2 $mg "pipeline_parallel_local_matches_with_a_mask" 100
    tests pp2_shared_mask $mg "one_mask_for_every_microbatch" 100
    ;;
b)
    tests tp2_dropout0.1 $mg "dropout_follows" 300
    tests hang tests/gpu/test_hang_gpu.py "rank0_only" 200
    secs=$(limit 60)
    if [ "$secs" -ge 40 ]; then
        start=$SECONDS
        timeout -k 10 "$secs" python -m torch.distributed.run --standalone --nproc-per-node 2 -m graphdoctor diff \
            --impl local --dropout 0 --tensor-model-parallel-size 2 --num-layers 2 --steps 5 --no-launches \
            --timeout 60 -q --json "$out/torchrun_tp2.json" > "$out/torchrun_tp2.txt" 2>&1
        note "torchrun -m graphdoctor diff (T=2): exit $? wall $((SECONDS - start)) s"
    else
        note "torchrun -m graphdoctor diff: not run (budget spent)"
    fi
    ;;
c)
    tests teardown tests/gpu/test_hang_gpu.py "teardown_hang" 240
    tests tp2_eval_exit tests/gpu/test_hang_gpu.py "evaluation_exits_cleanly" 300
    ;;
te)
    tests tp2_sp_te $mg "sequence_parallel" 200
    ;;
ep)
    tests ep2 $mg "expert_parallel" 480
    ;;
esac
done
part=$parts
python tests/benchmarks/multi_gpu_table.py --out "$out/table" --from-reports "$out/reports" > "$out/table.log" 2>&1
note "table: exit $? ($out/table/table.md)"
ps -eo pid,ppid,etimes,args | grep -E "graphdoctor|torch.distributed" | grep -v grep > "$out/ps_after.txt"
note "left running: $(wc -l < "$out/ps_after.txt") processes (ps_after.txt); total $((SECONDS - begin)) s"
cat "$out/table/table.md" 2>/dev/null
