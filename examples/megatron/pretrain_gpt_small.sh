#!/bin/bash

# A Megatron-LM GPT pretraining script in the form of Megatron-LM's examples/gpt3 scripts, shrunk to run
# in about a minute on one GPU, with Megatron's local CUDA graphs. Run it with Megatron-LM:
#   bash examples/megatron/pretrain_gpt_small.sh /tmp/ckpt
# or give it to graphdoctor, which trains the same model eager and graphed and compares them:
#   graphdoctor diff --megatron-args @examples/megatron/pretrain_gpt_small.sh

export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=1
MASTER_ADDR=localhost
MASTER_PORT=6000
NUM_NODES=1

CHECKPOINT_PATH=$1 #<Specify path>

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NUM_NODES
    --master_addr $MASTER_ADDR
    --master_port $MASTER_PORT
)

GPT_MODEL_ARGS=(
    --num-layers 4
    --hidden-size 512
    --num-attention-heads 8
    --ffn-hidden-size 2048
    --seq-length 256
    --max-position-embeddings 256
    --transformer-impl local
    --no-gradient-accumulation-fusion  # its fused kernel needs Apex
    --no-persist-layer-norm            # so does the persistent LayerNorm (torch LayerNorm refuses it)
    --no-masked-softmax-fusion         # its kernel is built with Megatron-LM, not shipped with megatron-core
    --attention-backend auto # Can use (flash/fused/unfused/local)
    --hidden-dropout 0.0
    --attention-dropout 0.0
)

CUDA_GRAPH_ARGS=(
    --cuda-graph-impl local
    --cuda-graph-warmup-steps 2
)

TRAINING_ARGS=(
    --micro-batch-size 2
    --global-batch-size 4
    --train-iters 20
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.95
    --init-method-std 0.02
    --clip-grad 1.0
    --bf16
    --lr 6.0e-4
    --lr-decay-style cosine
    --min-lr 6.0e-5
    --lr-warmup-fraction .01
    --seed 1234
)

MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 1
)

DATA_ARGS=(
    --mock-data
    --tokenizer-type NullTokenizer
    --vocab-size 4096
    --split 949,50,1
)

EVAL_AND_LOGGING_ARGS=(
    --log-interval 1
    --save-interval 10000
    --eval-interval 1000
    --save $CHECKPOINT_PATH
    --eval-iters 10
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${GPT_MODEL_ARGS[@]} \
    ${CUDA_GRAPH_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${MODEL_PARALLEL_ARGS[@]} \
    ${DATA_ARGS[@]} \
    ${EVAL_AND_LOGGING_ARGS[@]}
