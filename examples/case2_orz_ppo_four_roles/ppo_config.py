# Open-Reasoner-Zero PPO on Qwen2.5-1.5B (case 2): the settings that set memory, in ORZ's names
# (orz/exps/examples/ppo/ppo_base_exp.py BasePPOExpConfig). Everything on 4 x A100-80GB (colocate_all).
pretrain = "Qwen/Qwen2.5-1.5B"
critic_pretrain = "Qwen/Qwen2.5-1.5B"
reward_pretrain = "Qwen/Qwen2.5-1.5B"
colocate_all = True
vllm_num_engines = 4
vllm_tensor_parallel_size = 1
gpu_memory_utilization = 0.85  # ORZ's default; the fix was 0.5
zero_stage = 3
bf16 = True
adam_offload = True  # ORZ's default: AdamW state on the CPU (the estimate keeps it on the GPU: errs high)
gradient_checkpointing = True
rollout_batch_size = 2
micro_rollout_batch_size = 2
micro_train_batch_size = 2
prompt_max_len = 512  # "1k sequences": 512 + 512 is our reading
generate_max_len = 512
