"""Key names of the files `vram-estimate --config` reads, to tell a typo from another tool's key.

Generated once from the installed releases (trl 1.16.0, accelerate 1.15.0) and open-r1 at 1416fa0:

    TRL_KEYS: dataclasses.fields of trl GRPOConfig (with transformers TrainingArguments), ModelConfig,
        ScriptArguments, DatasetMixtureConfig and trl/scripts/grpo.py GRPOScriptArguments -- what
        `trl grpo --config` accepts (trl/scripts/grpo.py make_parser);
    OPEN_R1_KEYS: open-r1 src/open_r1/configs.py GRPOConfig / ScriptArguments / GRPOScriptArguments fields
        beyond TRL's (https://github.com/huggingface/open-r1/blob/1416fa0cf21595d2083b399a2a0bbddd7f6e9563/src/open_r1/configs.py);
    ACCELERATE_KEYS: accelerate.commands.config.config_args.ClusterConfig fields (accelerate refuses others:
        BaseConfig.from_yaml_file, "had unknown keys");
    LAUNCH_BOOL_FLAGS / LAUNCH_VALUE_FLAGS: `accelerate launch` options without / with a value
        (accelerate.commands.launch.launch_command_parser).
"""

# trl 1.16.0 GRPOConfig + ModelConfig + ScriptArguments + DatasetMixtureConfig + GRPOScriptArguments
TRL_KEYS = frozenset(
    """
    accelerator_config activation_checkpointing activation_checkpointing_kwargs adam_beta1 adam_beta2 adam_epsilon
    attn_implementation auto_find_batch_size average_tokens_across_devices batch_eval_metrics beta bf16
    bf16_full_eval bnb_4bit_quant_storage bnb_4bit_quant_type cache_implementation cast_lm_head_to_fp32
    chat_template_kwargs data_seed dataloader_drop_last dataloader_in_order dataloader_multiprocessing_context
    dataloader_num_workers dataloader_persistent_workers dataloader_pin_memory dataloader_prefetch_factor
    dataset_config dataset_name dataset_streaming dataset_test_split dataset_train_split datasets ddp_backend
    ddp_broadcast_buffers ddp_bucket_cap_mb ddp_find_unused_parameters ddp_static_graph ddp_timeout debug
    deepspeed delta disable_dropout disable_tqdm do_eval do_predict do_train ds3_gather_for_generation dtype
    enable_jit_checkpoint entropy_coef entropy_coef_delta entropy_coef_max entropy_coef_min entropy_target epsilon
    epsilon_high eval_accumulation_steps eval_delay eval_do_concat_batches eval_on_start eval_steps eval_strategy
    eval_use_gather_object fp16 fp16_full_eval fsdp fsdp_config full_determinism generation_batch_size
    generation_kwargs gradient_accumulation_steps gradient_checkpointing gradient_checkpointing_kwargs
    greater_is_better hub_always_push hub_model_id hub_private_repo hub_revision hub_strategy hub_token
    ignore_bias_buffers ignore_data_skip importance_sampling_level include_for_metrics
    include_num_input_tokens_seen label_names label_smoothing_factor learning_rate length_column_name
    liger_kernel_config load_best_model_at_end load_in_4bit load_in_8bit local_rank log_completions
    log_completions_hub_repo log_level log_level_replica log_multimodal log_on_each_node log_unique_prompts
    logging_first_step logging_nan_inf_filter logging_steps logging_strategy lora_alpha lora_dropout
    lora_modules_to_save lora_r lora_target_modules lora_target_parameters lora_task_type loss_type
    lr_scheduler_kwargs lr_scheduler_type mask_truncated_completions max_completion_length max_grad_norm max_steps
    max_tool_calling_iterations metric_for_best_model min_p model_init_kwargs model_name_or_path model_revision
    multi_objective_aggregation neftune_noise_alpha num_completions_to_print num_generations num_generations_eval
    num_iterations num_train_epochs off_policy_mask_threshold optim optim_args optim_target_modules output_dir
    pad_to_multiple_of parallelism_config per_device_eval_batch_size per_device_train_batch_size
    prediction_loss_only project push_to_hub ref_model_mixup_alpha ref_model_sync_steps remove_unused_columns
    repetition_penalty report_to restore_callback_states_from_checkpoint resume_from_checkpoint reward_funcs
    reward_model_name_or_path reward_weights router_aux_loss_coef run_name sapo_temperature_neg
    sapo_temperature_pos save_on_each_node save_only_model save_steps save_strategy save_total_limit scale_rewards
    seed shuffle_dataset skip_memory_metrics steps_per_generation streaming sync_ref_model temperature
    test_split_size tf32 top_entropy_quantile top_k top_p torch_compile torch_compile_backend torch_compile_mode
    torch_empty_cache_steps trackio_bucket_id trackio_space_id trackio_static_space_id train_sampling_strategy
    transformers_continuous_batching_config trust_remote_code use_adaptive_entropy use_bias_correction_kl
    use_bnb_nested_quant use_cache use_cpu use_dora use_liger_kernel use_peft use_rslora
    use_transformers_continuous_batching use_transformers_paged use_vllm vespo_k_neg vespo_k_pos vespo_lambda_neg
    vespo_lambda_pos vllm_enable_sleep_mode vllm_gpu_memory_utilization vllm_group_port
    vllm_importance_sampling_cap vllm_importance_sampling_clip_max vllm_importance_sampling_clip_min
    vllm_importance_sampling_correction vllm_importance_sampling_mode vllm_max_model_length vllm_mode
    vllm_model_impl vllm_server_base_url vllm_server_host vllm_server_port vllm_server_timeout
    vllm_structured_outputs_regex vllm_tensor_parallel_size warmup_steps weight_decay
    """.split()
)

# open-r1 1416fa0 recipe keys beyond TRL's
OPEN_R1_KEYS = frozenset(
    """
    benchmarks callbacks chat_template code_eval_scoring_mode code_eval_test_batch_size code_language
    code_provider cosine_max_len cosine_max_value_correct cosine_max_value_wrong cosine_min_value_correct
    cosine_min_value_wrong dataset_mixture dataset_prompt_column e2b_router_url hub_model_revision ioi_provider
    max_completion_len morph_router_url overwrite_hub_revision parallel_code_exec_per_proc push_to_hub_revision
    repetition_max_penalty repetition_n_grams soft_punish_cache system_prompt wandb_entity
    wandb_log_unique_prompts wandb_project wandb_run_group
    """.split()
)

# the OPEN_R1_KEYS no other trainer's config is likely to carry (the others: wandb_*, system_prompt,
# chat_template, callbacks, benchmarks, hub revisions): what marks a file as an open-r1 recipe
OPEN_R1_MARKERS = frozenset(
    """
    code_eval_scoring_mode code_eval_test_batch_size code_language code_provider cosine_max_len
    cosine_max_value_correct cosine_max_value_wrong cosine_min_value_correct cosine_min_value_wrong dataset_mixture
    dataset_prompt_column e2b_router_url ioi_provider max_completion_len morph_router_url
    parallel_code_exec_per_proc repetition_max_penalty repetition_n_grams soft_punish_cache
    """.split()
)

# accelerate 1.15.0 ClusterConfig
ACCELERATE_KEYS = frozenset(
    """
    command_file commands compute_environment debug deepspeed_config distributed_type downcast_bf16 dynamo_config
    enable_cpu_affinity fp8_config fsdp_config gpu_ids machine_rank main_process_ip main_process_port
    main_training_function megatron_lm_config mixed_precision mpirun_config num_machines num_processes
    parallelism_config rdzv_backend same_network tpu_env tpu_name tpu_use_cluster tpu_use_sudo tpu_vm tpu_zone
    use_cpu
    """.split()
)

# accelerate 1.15.0 launch options that take no value
LAUNCH_BOOL_FLAGS = frozenset(
    """
    --cpu --debug --downcast-bf16 --downcast_bf16 --dynamo-use-dynamic --dynamo-use-fullgraph --dynamo-use-
    regional-compilation --dynamo_use_dynamic --dynamo_use_fullgraph --dynamo_use_regional_compilation --enable-
    cpu-affinity --enable_cpu_affinity --fp8-use-autocast-during-eval --fp8_use_autocast_during_eval --help
    --module --multi-gpu --multi_gpu --no-python --no-tpu-cluster --no_python --no_tpu_cluster --quiet --same-
    network --same_network --tpu --tpu-cluster --tpu-use-sudo --tpu_cluster --tpu_use_sudo --use-deepspeed --use-
    fsdp --use-megatron-lm --use-parallelism-config --use_deepspeed --use_fsdp --use_megatron_lm
    --use_parallelism_config -m -q
    """.split()
)

# accelerate 1.15.0 launch options that take a value
LAUNCH_VALUE_FLAGS = frozenset(
    """
    --aws-access-key-id --aws-secret-access-key --aws_access_key_id --aws_secret_access_key --config-file
    --config_file --deepspeed-config-file --deepspeed-exclusion-filter --deepspeed-hostfile --deepspeed-inclusion-
    filter --deepspeed-moe-layer-cls-names --deepspeed-multinode-launcher --deepspeed_config_file
    --deepspeed_exclusion_filter --deepspeed_hostfile --deepspeed_inclusion_filter --deepspeed_moe_layer_cls_names
    --deepspeed_multinode_launcher --dynamo-backend --dynamo-mode --dynamo_backend --dynamo_mode --env --fp8-amax-
    compute-algo --fp8-amax-history-len --fp8-backend --fp8-enable-fsdp-float8-all-gather --fp8-format
    --fp8-interval --fp8-margin --fp8-opt-level --fp8-override-linear-precision --fp8-pad-inner-dim
    --fp8_amax_compute_algo --fp8_amax_history_len --fp8_backend --fp8_enable_fsdp_float8_all_gather --fp8_format
    --fp8_interval --fp8_margin --fp8_opt_level --fp8_override_linear_precision --fp8_pad_inner_dim --fsdp-
    activation-checkpointing --fsdp-activation-checkpointing-offload --fsdp-auto-wrap-policy --fsdp-backward-
    prefetch --fsdp-cpu-ram-efficient-loading --fsdp-forward-prefetch --fsdp-min-num-params --fsdp-offload-params
    --fsdp-reshard-after-forward --fsdp-sharding-strategy --fsdp-state-dict-type --fsdp-sync-module-states --fsdp-
    transformer-layer-cls-to-wrap --fsdp-use-orig-params --fsdp-version --fsdp_activation_checkpointing
    --fsdp_activation_checkpointing_offload --fsdp_auto_wrap_policy --fsdp_backward_prefetch
    --fsdp_cpu_ram_efficient_loading --fsdp_forward_prefetch --fsdp_min_num_params --fsdp_offload_params
    --fsdp_reshard_after_forward --fsdp_sharding_strategy --fsdp_state_dict_type --fsdp_sync_module_states
    --fsdp_transformer_layer_cls_to_wrap --fsdp_use_orig_params --fsdp_version --gpu-ids --gpu_ids --gradient-
    accumulation-steps --gradient-clipping --gradient_accumulation_steps --gradient_clipping --log-dir --log_dir
    --machine-rank --machine_rank --main-process-ip --main-process-port --main-training-function --main_process_ip
    --main_process_port --main_training_function --max-restarts --max_restarts --megatron-lm-attention-backend
    --megatron-lm-attention-dropout --megatron-lm-attention-softmax-in-fp32 --megatron-lm-calculate-per-token-loss
    --megatron-lm-context-parallel-size --megatron-lm-decoder-last-pipeline-num-layers --megatron-lm-eod-mask-loss
    --megatron-lm-expert-model-parallel-size --megatron-lm-expert-tensor-parallel-size --megatron-lm-gradient-
    clipping --megatron-lm-hidden-dropout --megatron-lm-no-load-optim --megatron-lm-no-save-optim --megatron-lm-
    num-micro-batches --megatron-lm-optimizer-cpu-offload --megatron-lm-overlap-cpu-optimizer-d2h-h2d --megatron-
    lm-pp-degree --megatron-lm-recompute-activations --megatron-lm-recompute-granularity --megatron-lm-recompute-
    method --megatron-lm-recompute-num-layers --megatron-lm-sequence-parallelism --megatron-lm-tp-degree
    --megatron-lm-use-custom-fsdp --megatron-lm-use-distributed-optimizer --megatron-lm-use-precision-aware-
    optimizer --megatron-lm-use-rotary-position-embeddings --megatron_lm_attention_backend
    --megatron_lm_attention_dropout --megatron_lm_attention_softmax_in_fp32 --megatron_lm_calculate_per_token_loss
    --megatron_lm_context_parallel_size --megatron_lm_decoder_last_pipeline_num_layers --megatron_lm_eod_mask_loss
    --megatron_lm_expert_model_parallel_size --megatron_lm_expert_tensor_parallel_size
    --megatron_lm_gradient_clipping --megatron_lm_hidden_dropout --megatron_lm_no_load_optim
    --megatron_lm_no_save_optim --megatron_lm_num_micro_batches --megatron_lm_optimizer_cpu_offload
    --megatron_lm_overlap_cpu_optimizer_d2h_h2d --megatron_lm_pp_degree --megatron_lm_recompute_activations
    --megatron_lm_recompute_granularity --megatron_lm_recompute_method --megatron_lm_recompute_num_layers
    --megatron_lm_sequence_parallelism --megatron_lm_tp_degree --megatron_lm_use_custom_fsdp
    --megatron_lm_use_distributed_optimizer --megatron_lm_use_precision_aware_optimizer
    --megatron_lm_use_rotary_position_embeddings --mixed-precision --mixed_precision --monitor-interval
    --monitor_interval --mpirun-hostfile --mpirun_hostfile --num-cpu-threads-per-process --num-machines --num-
    processes --num_cpu_threads_per_process --num_machines --num_processes --offload-optimizer-device --offload-
    optimizer-nvme-path --offload-param-device --offload-param-nvme-path --offload_optimizer_device
    --offload_optimizer_nvme_path --offload_param_device --offload_param_nvme_path --parallelism-config-cp-backend
    --parallelism-config-cp-comm-strategy --parallelism-config-cp-size --parallelism-config-dp-replicate-size
    --parallelism-config-dp-shard-size --parallelism-config-sp-attn-implementation --parallelism-config-sp-backend
    --parallelism-config-sp-seq-length --parallelism-config-sp-seq-length-is-variable --parallelism-config-sp-size
    --parallelism-config-tp-size --parallelism_config_cp_backend --parallelism_config_cp_comm_strategy
    --parallelism_config_cp_size --parallelism_config_dp_replicate_size --parallelism_config_dp_shard_size
    --parallelism_config_sp_attn_implementation --parallelism_config_sp_backend --parallelism_config_sp_seq_length
    --parallelism_config_sp_seq_length_is_variable --parallelism_config_sp_size --parallelism_config_tp_size
    --rdzv-backend --rdzv-conf --rdzv_backend --rdzv_conf --role --tee --vm --zero-stage --zero3-init-flag
    --zero3-save-16bit-model --zero3_init_flag --zero3_save_16bit_model --zero_stage
    """.split()
)

# transformers 4.57.1 TrainingArguments fields that 5.24.0 no longer has (recipes written for transformers 4 carry
# them, e.g. open-r1's overwrite_output_dir and warmup_ratio)
TRANSFORMERS_4_KEYS = frozenset(
    """
    adafactor fp16_backend fp16_opt_level fsdp_min_num_params fsdp_transformer_layer_cls_to_wrap group_by_length
    half_precision_backend include_inputs_for_metrics include_tokens_per_second jit_mode_eval logging_dir
    mp_parameters no_cuda overwrite_output_dir past_index per_gpu_eval_batch_size per_gpu_train_batch_size
    push_to_hub_model_id push_to_hub_organization push_to_hub_token ray_scope save_safetensors torchdynamo
    tpu_metrics_debug tpu_num_cores use_legacy_prediction_loop use_mps_device warmup_ratio
    """.split()
)

# `trl grpo --config FILE` hands the file's keys its GRPO parser does not consume to accelerate launch as
# `--key value` (trl 1.16.0 TrlParser.set_defaults_with_config, cli/commands/training.py); `accelerate_config`
# names an accelerate config (trl/cli/accelerate_config.py)
LAUNCH_KEYS = (
    frozenset(
        {o[2:].replace("-", "_") for o in (*LAUNCH_BOOL_FLAGS, *LAUNCH_VALUE_FLAGS) if o.startswith("--")}
        | {"accelerate_config"}
    )
    - TRL_KEYS
)

# GRPOConfig fields of earlier TRL releases (0.14.0, 0.15.2, 0.17.0, 0.19.1, 0.21.0, 0.23.0, 0.25.0 read) that
# 1.16 no longer has: a config written for one of them carries them
EARLIER_TRL_KEYS = frozenset(
    """
    use_liger_loss vllm_device vllm_dtype vllm_enable_prefix_caching vllm_guided_decoding_regex
    wandb_log_unique_prompts
    """.split()
)
