#!/usr/bin/env bash
# Issue 18 acceptance on one H200, one device call per part (each under 10 minutes), with logs, terminal
# tables and JSON documents under $OUT (GD_REPORT_DIR keeps every advise the tests run):
#   core: dense local spec fp32 (test and the CLI) and graph_layers with local, Transformer Engine not staged;
#   moe:  the MoE model (tests/gpu/advise_moe.yaml), rejected scopes with their rules, and with Transformer Engine
#         staged the transformer_engine scopes ranked beside the others (device_call.sh gives it TE);
#   te:   Transformer Engine staged: the TE spec in bf16 (bisection to attention), graph_layers with TE.
#   source .whl/gpu-env.sh && [source .whl/te-env.sh &&] bash tests/gpu/run_advise_acceptance.sh core|moe|te
set -u
part=${1:-core}
out=${OUT:-/tmp/gd-advise}
mkdir -p "$out/reports"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export GD_REPORT_DIR="$out/reports"
tests() {  # name, -k expression, seconds
    local start=$SECONDS
    timeout "$3" python -m pytest -q -rA -p no:cacheprovider tests/gpu/test_advise_gpu.py -k "$2" > "$out/pytest_$1.log" 2>&1
    echo "pytest $1: exit $? wall $((SECONDS - start)) s: $(tail -1 "$out/pytest_$1.log")" >> "$out/summary.txt"
}
advise() {  # name, advise args...
    local name=$1; shift
    local start=$SECONDS
    timeout 240 python -m graphdoctor.cli advise -q --json "$out/cli_$name.json" "$@" > "$out/cli_$name.txt" 2> "$out/cli_$name.err"
    echo "cli $name: exit $? wall $((SECONDS - start)) s" >> "$out/summary.txt"
}
small="--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 64 --vocab-size 512 --steps 8 --jobs 4"
case "$part" in
    core) tests core "dense or graph_layers_graphs_only" 330
          advise dense_fp32 $small --impl local,full_iteration --time-budget 200 ;;
    moe)  tests moe "moe" 300 ;;
    te)   tests te "te_spec or with_transformer_engine" 540 ;;
esac
cat "$out/summary.txt"
