#!/usr/bin/env bash
# Installs the staged Transformer Engine into its own directory, /tmp/te-site, so that one device call can run
# parts with TE (device_call.sh puts /tmp/te-site on their PYTHONPATH: te, moe-te, advise-te, mg-te) beside parts
# that must not see it (core, i15, i20, advise-core, advise-moe: their `without_te` tests run only where TE
# does not import). The six core-wheel parts must already be in /tmp/te-parts (../shared/device/README.md).
#   source .whl/gpu-env.sh && bash tests/gpu/te_env.sh && bash tests/gpu/device_call.sh 560 te@0 core@0
set -u
site=/tmp/te-site
if PYTHONPATH=$site:${PYTHONPATH:-} python3 -c "import transformer_engine.pytorch" >/dev/null 2>&1; then
    echo "te_env: already installed in $site"; exit 0
fi
n=$(ls /tmp/te-parts/part* 2>/dev/null | wc -l)
[ "$n" -eq 6 ] || { echo "te_env: only $n of 6 core-wheel parts in /tmp/te-parts; make the six part calls first"; exit 1; }
core=/tmp/te-parts/transformer_engine_cu13-2.20.2-py3-none-manylinux_2_28_x86_64.whl
cat /tmp/te-parts/part0 /tmp/te-parts/part1 /tmp/te-parts/part2 /tmp/te-parts/part3 /tmp/te-parts/part4 \
    /tmp/te-parts/part5 > "$core"
[ "$(md5sum "$core" | cut -d' ' -f1)" = "$(cat .whl/te/core.md5)" ] || { echo "te_env: core wheel checksum mismatch"; exit 1; }
# the metadata package and pure-Python dependencies first, then the core and the torch extension over them
python3 -m pip install -q --no-index --no-deps --target "$site" .whl/te/transformer_engine-2.20.2-py3-none-any.whl \
    .whl/te/pydantic-*.whl .whl/te/pydantic_core-*.whl .whl/te/typing_inspection-*.whl .whl/te/annotated_types-*.whl \
    .whl/te/nvdlfw_inspect-*.whl .whl/te/nvidia_cudnn_frontend-*.whl 2>&1 | grep -v "^WARNING"
python3 -m pip install -q --no-index --no-deps --upgrade --target "$site" "$core" \
    .whl/te/transformer_engine_torch-*.whl 2>&1 | grep -v "^WARNING"
PYTHONPATH=$site:${PYTHONPATH:-} python3 -c "import transformer_engine.pytorch; print('te_env: transformer_engine in $site')" 2>&1 | tail -1
python3 -c "import transformer_engine" > /dev/null 2>&1 && echo "te_env: WARNING transformer_engine imports without $site"
exit 0
