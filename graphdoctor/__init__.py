"""graphdoctor: CUDA-graph capture debugging and correctness toolkit for Megatron-Core."""
