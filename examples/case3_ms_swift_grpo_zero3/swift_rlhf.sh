# ms-swift 3.1.1 GRPO as the user launched it (issue 12, case 3), 4 x A100-80GB. At that version ms-swift's
# GRPO put vLLM on a device of its own choosing (vllm_device auto = the last GPU) while training ran on every
# GPU it was given: with 4 training processes on 4 GPUs, vLLM shares GPU 3 with a training rank. That card is
# the one modelled (colocate); this reading is ours, the report did not say which card ran out.
NPROC_PER_NODE=4 CUDA_VISIBLE_DEVICES=0,1,2,3 swift rlhf \
    --rlhf_type grpo \
    --model Qwen/Qwen2.5-7B-Instruct \
    --train_type lora \
    --use_vllm true \
    --vllm_gpu_memory_utilization 0.6 \
    --vllm_max_model_len 2048 \
    --per_device_train_batch_size 8 \
    --gradient_accumulation_steps 8 \
    --num_generations 8 \
    --max_length 2048 \
    --max_completion_length 1024 \
    --torch_dtype bfloat16 \
    --deepspeed zero3
