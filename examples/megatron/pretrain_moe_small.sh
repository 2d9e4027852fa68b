#!/bin/bash

# A Mixtral-style MoE pretraining script in the form of Megatron-LM's examples/mixtral scripts, shrunk to
# one GPU: 4 experts, top-2 routing with aux loss, dropless alltoall, local CUDA graphs with modules attn
# (megatron-core 0.19.2 graphs the whole GPT layer for that, token dispatch included: GD219, GD217). Diff:
#   graphdoctor diff --megatron-args @examples/megatron/pretrain_moe_small.sh --num-layers 2

export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=1
NNODES=${SLURM_NNODES:-"1"}
MASTER_ADDR=${MASTER_ADDR:-"localhost"}
MASTER_PORT=${MASTER_PORT:-"6000"}

CHECKPOINT_PATH=$1
TOKENIZER_MODEL=$2

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NNODES
    --master_addr $MASTER_ADDR
    --master_port $MASTER_PORT
)

MODEL_ARGS=(
    --disable-bias-linear
    --seq-length 256
    --max-position-embeddings 4096
    --num-layers 4
    --hidden-size 512
    --ffn-hidden-size 1024
    --num-attention-heads 8
    --init-method-std 0.01
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --normalization RMSNorm
    --position-embedding-type rope
    --swiglu
    --untie-embeddings-and-output-weights
    --group-query-attention
    --num-query-groups 2
    --no-masked-softmax-fusion
    --rotary-base 1000000
    --transformer-impl local
    --no-rope-fusion                 # rotary fusion needs Transformer Engine
    --no-gradient-accumulation-fusion  # its fused kernel needs Apex
    --no-persist-layer-norm            # so does the persistent LayerNorm (torch LayerNorm refuses it)
)

MOE_ARGS=(
    --num-experts 4
    --moe-router-topk 2
    --moe-router-load-balancing-type aux_loss
    --moe-aux-loss-coeff 1e-2
    --moe-z-loss-coeff 1e-3
    --moe-token-dispatcher-type alltoall
    --moe-ffn-hidden-size 1024
    --overlap-grad-reduce
)

CUDA_GRAPH_ARGS=(
    --cuda-graph-impl local
    --cuda-graph-modules attn
    --cuda-graph-warmup-steps 2
)

DATA_ARGS=(
    --tokenizer-type Llama2Tokenizer
    --tokenizer-model ${TOKENIZER_MODEL}
    --mock-data
    --split 99990,8,2
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 2
    --lr 1e-4
    --train-iters 20
    --min-lr 1.0e-5
    --weight-decay 0.1
    --clip-grad 1.0
    --bf16
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 1
    --expert-model-parallel-size 1
    --use-distributed-optimizer
)

LOGGING_ARGS=(
    --log-interval 1
    --eval-iters 0
    --save $CHECKPOINT_PATH
    --no-load-optim
    --no-load-rng
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${MODEL_ARGS[@]} \
    ${MOE_ARGS[@]} \
    ${CUDA_GRAPH_ARGS[@]} \
    ${DATA_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    ${LOGGING_ARGS[@]}
