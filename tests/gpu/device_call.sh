#!/usr/bin/env bash
# One device call of several acceptance parts at once, on a one- or two-GPU machine, packed for the trip back
# (the device tool returns at most 8 files): every part writes under /tmp/gd-call/<part>, and at the end, or
# when the call's own deadline passes, everything is packed into $OUT/call.tgz and each part's summary printed.
#   source .whl/gpu-env.sh && [source .whl/te-env.sh &&] bash tests/gpu/device_call.sh SECONDS PART[@GPU] ...
# PART: core | i15 | i20 | i33 | i34 | i35 | i42 | i43 | i45 | i45b | i49 | i49te | te | moe-te | i30 (tests/gpu/run_acceptance.sh parts),
# readme (`graphdoctor diff --json` with the defaults: the README's main job), te-removed (the TE GPU tests with
# GRAPHDOCTOR_EXPECT_TE=1 where TE is not staged: passes only when they fail naming transformer_engine), mg-a | mg-b | mg-c | mg-te | mg-ep | mg-a+b (the parts of
# tests/gpu/run_multi_gpu_acceptance.sh; they take every visible GPU), advise-core | advise-moe | advise-te
# (tests/gpu/run_advise_acceptance.sh), scale (tests/benchmarks/diff_scale.py at default,0.5b,1.3b),
# schedule-cost (diff_scale.py --sizes schedule: issue 20's schedule with and without comparison), holders-cost
# (tests/benchmarks/holders_cost.py at 24x1024 and 32x2048, or GD_HOLDERS_SIZES="24 1024 2,..." (layers width
# repeats): issue 42's watch, alone on the GPU), cost (tests/benchmarks/diff_cost.py at GD_COST_SIZES, default
# "default,0.54b", flag sets GD_COST_FLAGS, default "defaults,dropout0": bare runs one after another and side by side,
# each diff, each first child against its bare twin), gpu-init (tests/gpu/test_gpu_init_gpu.py: equal weights in
# every child, with transformer_engine where tests/gpu/te_env.sh staged it), taps-cost (tests/benchmarks/fingerprint_cost.py, one mask's
# fingerprint; then tests/benchmarks/taps_cost.py at GD_TAPS_SIZES, default 0.54b: eager and graphed, plain against tapped), mem-stages
# (tests/benchmarks/child_memory_stages.py: a child's memory outside the allocator, stage by stage), imports
# (tests/benchmarks/import_collector.py: a bare process's imports against the template's, collector on and frozen).
# te, moe-te, i30, i35, i43, i49te, advise-te, advise-moe, mg-te and mg-ep see Transformer Engine where tests/gpu/te_env.sh installed it (/tmp/te-site);
# the other parts do not, so `without_te` tests run in the same call. @GPU pins a one-GPU part to one GPU (CUDA_VISIBLE_DEVICES), e.g. `i15@0 i20@1`. SECONDS bounds the whole call
# (default 560: under the device tool's 600 s limit, with time left to pack).
set -u
deadline=${1:-560}
shift || true
# Every part needs megatron-core on the path: a call that forgot `source .whl/gpu-env.sh` (or sent it to the
# background with `&`) ran every GPU test to "No module named 'megatron'" once; say so at once instead.
if ! python -c "import megatron.core, graphdoctor" > /dev/null 2>&1; then
    echo "device_call: megatron-core or graphdoctor does not import here: run 'source .whl/gpu-env.sh' first, in the foreground (../shared/device/README.md)"
    exit 2
fi
work=/tmp/gd-call
out=${OUT:-/tmp/gd-call-out}
rm -rf "$work"  # a warm machine keeps /tmp: an earlier call's summaries must not count in this one's exit status
mkdir -p "$work" "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
inner=$(( deadline - 20 ))
{ git log --oneline -1; nvidia-smi -L; PYTHONPATH=/tmp/te-site:${PYTHONPATH:-} python -c "import transformer_engine.pytorch; print('TE', transformer_engine.__version__)" 2>&1 | tail -1; } > "$work/machine.txt" 2>&1
start_part() {  # part, gpu
    local part=$1 gpu=$2 dir="$work/$1"
    mkdir -p "$dir"
    local pin=()
    [ -n "$gpu" ] && pin=(env CUDA_VISIBLE_DEVICES="$gpu")
    case "$part" in  # Transformer Engine only where a part needs it (tests/gpu/te_env.sh installs it in /tmp/te-site)
        te|moe-te|i30|i35|i43|i49te|advise-te|advise-moe|mg-te|mg-ep|mg-*+te*|mg-*+ep*|mg-te+*|mg-ep+*)
            export PYTHONPATH=/tmp/te-site${PYTHONPATH:+:$PYTHONPATH} GRAPHDOCTOR_EXPECT_TE=1 ;;
        gpu-init) [ -d /tmp/te-site ] && export PYTHONPATH=/tmp/te-site${PYTHONPATH:+:$PYTHONPATH} GRAPHDOCTOR_EXPECT_TE=1 ;;
    esac
    case "$part" in
        core|i15|i20|i33|i34|i35|i42|i43|i45|i45b|i49|i49te|te|moe-te|i30) OUT="$dir" "${pin[@]}" bash tests/gpu/run_acceptance.sh "$inner" "$part" ;;
        readme) "${pin[@]}" timeout "$inner" graphdoctor diff --json "$dir/readme.json" > "$dir/readme.txt" 2>&1
                echo "readme: exit $?" >> "$dir/summary.txt" ;;  # the README's main job, with the defaults
        te-removed) GRAPHDOCTOR_EXPECT_TE=1 "${pin[@]}" timeout "$inner" python -m pytest -q -p no:cacheprovider \
                        tests/gpu/test_te_gpu.py > "$dir/te_removed.txt" 2>&1  # TE expected, not staged: must fail
                    code=$?; loud=$(grep -c "transformer_engine" "$dir/te_removed.txt")
                    if [ "$code" != 0 ] && [ "$loud" -gt 0 ]; then echo "te-removed: exit 0 (pytest exit $code, TE named $loud times)"
                    else echo "te-removed: exit 1 (pytest exit $code: a TE-expected run without TE did not fail loudly)"; fi \
                        >> "$dir/summary.txt" ;;
        mg-*) OUT="$dir" GD_BUDGET_S="$inner" bash tests/gpu/run_multi_gpu_acceptance.sh "${part#mg-}" ;;
        advise-core|advise-moe|advise-te) OUT="$dir" "${pin[@]}" bash tests/gpu/run_advise_acceptance.sh "${part#advise-}" ;;
        scale) "${pin[@]}" timeout "$inner" python tests/benchmarks/diff_scale.py --sizes default,0.5b,1.3b \
                   --out "$dir/scale.json" > "$dir/summary.txt" 2>&1; echo "scale: exit $?" >> "$dir/summary.txt" ;;
        holders-cost) IFS=, read -ra sizes <<< "${GD_HOLDERS_SIZES:-24 1024 2,32 2048 1}"  # layers width repeats, ...
               for size in "${sizes[@]}"; do set -- $size  # the watch's cost alone on the GPU (issue 42)
                   "${pin[@]}" timeout $(( inner / ${#sizes[@]} - 10 )) python tests/benchmarks/holders_cost.py --num-layers "$1" \
                       --hidden-size "$2" --repeats "$3" > "$dir/holders_cost_$1x$2.json" 2> "$dir/holders_cost_$1x$2.log"
                   echo "holders-cost $1x$2: exit $? $(grep -E '^(local|full_iteration):' "$dir/holders_cost_$1x$2.log" | tr '\n' ' ')" >> "$dir/summary.txt"
               done ;;
        cost) "${pin[@]}" timeout "$inner" python tests/benchmarks/diff_cost.py --sizes "${GD_COST_SIZES:-default,0.54b}" \
                   --flags "${GD_COST_FLAGS:-defaults,dropout0}" --out "$dir/diff_cost.json" > "$dir/diff_cost.txt" 2>&1
              echo "cost: exit $?" >> "$dir/summary.txt" ;;  # issue 49's columns and issue 44's ratios, alone on the GPU
        taps-cost) "${pin[@]}" timeout 120 python tests/benchmarks/fingerprint_cost.py > "$dir/fingerprint_cost.json" \
                       2> "$dir/fingerprint_cost.log"  # one mask's fingerprint, counted against cast and summed
                   echo "fingerprint-cost: exit $? $(tr '\n' ' ' < "$dir/fingerprint_cost.log")" >> "$dir/summary.txt"
                   IFS=, read -ra sizes <<< "${GD_TAPS_SIZES:-0.54b}"  # issue 44: do taps cost <= 10 % of a step?
               for size in "${sizes[@]}"; do
                   "${pin[@]}" timeout $(( inner / ${#sizes[@]} - 10 )) python tests/benchmarks/taps_cost.py --size "$size" \
                       --steps 12 > "$dir/taps_cost_$size.json" 2> "$dir/taps_cost_$size.log"
                   echo "taps-cost $size: exit $? $(grep -E '^(eager|local|full_iteration):' "$dir/taps_cost_$size.log" | tr '\n' ' ')" >> "$dir/summary.txt"
               done ;;
        mem-stages) "${pin[@]}" timeout 200 python tests/benchmarks/child_memory_stages.py > "$dir/mem_stages.json" \
                        2> "$dir/mem_stages.log"  # a child's GPU memory outside the allocator, stage by stage
                    echo "mem-stages: exit $? $(grep -c 'device used' "$dir/mem_stages.log") stages" >> "$dir/summary.txt"
                    grep 'device used' "$dir/mem_stages.log" >> "$dir/summary.txt" ;;
        gpu-init) "${pin[@]}" timeout "$inner" python -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_init_gpu.py \
                      > "$dir/gpu_init.txt" 2>&1
                  echo "gpu-init: exit $? $(tail -1 "$dir/gpu_init.txt")" >> "$dir/summary.txt" ;;
        imports) "${pin[@]}" timeout "$inner" python tests/benchmarks/import_collector.py --rounds 5 \
                     --json "$dir/import_collector.json" > "$dir/summary.txt" 2>&1
                 echo "imports: exit $?" >> "$dir/summary.txt" ;;
        schedule-cost) "${pin[@]}" timeout "$inner" python tests/benchmarks/diff_scale.py --sizes schedule \
                   --out "$dir/schedule.json" > "$dir/summary.txt" 2>&1; echo "schedule-cost: exit $?" >> "$dir/summary.txt" ;;
        *) echo "unknown part $part" > "$dir/summary.txt" ;;
    esac > "$dir/driver.log" 2>&1
}
pids=()
specs=("$@")
for spec in "$@"; do
    part=${spec%@*}
    gpu=""
    [ "$spec" != "$part" ] && gpu=${spec#*@}
    start_part "$part" "$gpu" &
    pids+=($!)
done
kill_tree() {  # every descendant first, then the process: a timeout or pytest under a killed script lives on
    local child
    for child in $(pgrep -P "$1"); do kill_tree "$child"; done
    kill -TERM "$1" 2>/dev/null
}
( sleep "$inner"; for pid in "${pids[@]}"; do for child in $(pgrep -P "$pid"); do kill_tree "$child"; done; done ) &
watchdog=$!
codes=()
for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; codes+=($?); done
kill "$watchdog" 2>/dev/null
# A diff stopped with its pytest (timeout's SIGTERM reaches the whole group) needs a few seconds to stop its
# children and write its report: give them 20 s before counting what is left running.
for _ in $(seq 20); do
    pgrep -f "graphdoctor|torch.distributed" > /dev/null || break
    sleep 1
done
ps -eo pid,ppid,etimes,args | grep -E "graphdoctor|torch.distributed|pytest" | grep -v grep > "$work/ps_after.txt"
tar czf "$out/call.tgz" -C "$work" .
cat "$work/machine.txt"
for spec in "$@"; do
    part=${spec%@*}
    echo "== $spec"
    tail -12 "$work/$part/summary.txt" 2>/dev/null
done
echo "left running: $(wc -l < "$work/ps_after.txt")"
# Exit 1 when a part failed (its driver's exit status, or a summary line `NAME: exit N` with N > 0, or `left out`)
# or wrote no summary (it never finished); the failing parts are named.
bad=()
for i in "${!pids[@]}"; do
    spec=${specs[$i]}; part=${spec%@*}
    if [ "${codes[$i]}" != 0 ] || [ ! -s "$work/$part/summary.txt" ] || grep -Eq ": exit [1-9]|: left out" "$work/$part/summary.txt"; then
        bad+=("$spec")
    fi
done
if [ ${#bad[@]} -gt 0 ]; then
    echo "device_call: failed or unfinished: ${bad[*]}"
    exit 1
fi
exit 0
