"""verl-style launch command lines, written for these tests from the keys verl's example scripts set
(examples/*_trainer/run_*.sh: GRPO, PPO, DAPO, GSPO, CISPO, GMPO, SAPO, reward models, rollout correction,
profiling, SGLang and TensorRT-LLM rollouts). `{model}`, `{train}`, `{val}` and `{out}` stand for the local
model, parquet files and output folder. Each must pass `trainer.dry_run=true` unchanged.
"""

GRPO_VLLM_ASYNC = """
algorithm.adv_estimator=grpo data.train_files={train} data.val_files={val} data.train_batch_size=1024
data.max_prompt_length=512 data.max_response_length=1024 data.filter_overlong_prompts=True data.truncation=error
actor_rollout_ref.model.path={model} actor_rollout_ref.actor.optim.lr=1e-6
actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.actor.ppo_mini_batch_size=256
actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000
actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001
actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.entropy_coeff=0
actor_rollout_ref.model.enable_gradient_checkpointing=True actor_rollout_ref.actor.fsdp_config.param_offload=False
actor_rollout_ref.actor.fsdp_config.optimizer_offload=False actor_rollout_ref.rollout.tensor_model_parallel_size=2
actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async
actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.n=5
actor_rollout_ref.rollout.enable_chunked_prefill=True actor_rollout_ref.rollout.max_num_batched_tokens=16384
actor_rollout_ref.rollout.max_num_seqs=512 actor_rollout_ref.rollout.load_format=safetensors
actor_rollout_ref.ref.fsdp_config.param_offload=True algorithm.use_kl_in_reward=False trainer.critic_warmup=0
trainer.logger='["console","wandb"]' trainer.project_name=verl_grpo_example_gsm8k trainer.experiment_name=qwen2_7b
trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.save_freq=20 trainer.test_freq=5 trainer.total_epochs=15
trainer.default_local_dir={out}
"""

PPO_LEGACY_WORKERS = """
data.train_files={train} data.val_files={val} data.train_batch_size=1024 data.max_prompt_length=512
data.max_response_length=512 data.filter_overlong_prompts=True data.truncation=error
actor_rollout_ref.model.path={model} actor_rollout_ref.actor.optim.lr=1e-6
actor_rollout_ref.model.use_remove_padding=True actor_rollout_ref.actor.ppo_mini_batch_size=256
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 actor_rollout_ref.actor.fsdp_config.param_offload=False
actor_rollout_ref.actor.fsdp_config.optimizer_offload=False actor_rollout_ref.actor.use_kl_loss=False
actor_rollout_ref.model.use_shm=True actor_rollout_ref.model.use_fused_kernels=True
actor_rollout_ref.model.fused_kernel_options.impl_backend=triton actor_rollout_ref.nccl_timeout=1200
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 actor_rollout_ref.rollout.tensor_model_parallel_size=4
actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.gpu_memory_utilization=0.5
actor_rollout_ref.rollout.multi_stage_wake_up=True critic.optim.lr=1e-5 critic.model.use_remove_padding=True
critic.model.path={model} critic.model.enable_gradient_checkpointing=True critic.ppo_micro_batch_size_per_gpu=32
critic.model.fsdp_config.param_offload=False critic.model.fsdp_config.optimizer_offload=False
algorithm.kl_ctrl.kl_coef=0.0001 trainer.use_legacy_worker_impl=auto trainer.critic_warmup=0
trainer.logger='["console","wandb"]' trainer.project_name=verl_example_gsm8k trainer.experiment_name=deepseek_llm_7b
trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.save_freq=20 trainer.test_freq=1 trainer.total_epochs=15
trainer.default_local_dir={out}
"""

PPO_REWARD_LOOP = """
algorithm.adv_estimator=gae data.train_files={train} data.val_files={val} data.train_batch_size=1024
data.max_prompt_length=1024 data.max_response_length=512 data.filter_overlong_prompts=True data.truncation=error
data.return_raw_chat=True actor_rollout_ref.model.path={model} actor_rollout_ref.actor.optim.lr=1e-6
actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1 actor_rollout_ref.actor.ppo_mini_batch_size=256
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 actor_rollout_ref.actor.use_kl_loss=False
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 actor_rollout_ref.rollout.tensor_model_parallel_size=2
actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.gpu_memory_utilization=0.5
critic.optim.lr=1e-5 critic.model.path={model} critic.model.enable_gradient_checkpointing=True
critic.ppo_micro_batch_size_per_gpu=32 critic.model.fsdp_config.param_offload=False
reward_model.enable=True reward_model.model.path={model} reward_model.use_reward_loop=True
reward_model.rollout.name=vllm reward_model.rollout.gpu_memory_utilization=0.8
reward_model.rollout.tensor_model_parallel_size=1 reward_model.rollout.prompt_length=2048
reward_model.rollout.response_length=1024 reward_model.num_workers=8 algorithm.use_kl_in_reward=False
trainer.critic_warmup=0 trainer.logger='["console","wandb"]' trainer.project_name=verl_example
trainer.experiment_name=Qwen2-7B-Instruct_hybrid_rm trainer.n_gpus_per_node=8 trainer.val_before_train=False
trainer.nnodes=1 trainer.save_freq=20 trainer.test_freq=5 trainer.total_epochs=15 trainer.default_local_dir={out}
"""

PPO_LEGACY_REWARD_MODEL = """
algorithm.adv_estimator=gae data.train_files={train} data.val_files={val} data.train_batch_size=1024
data.max_prompt_length=1024 data.max_response_length=512 data.return_raw_chat=True
actor_rollout_ref.model.path={model} actor_rollout_ref.actor.ppo_mini_batch_size=256
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 actor_rollout_ref.rollout.name=vllm
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 critic.model.path={model}
critic.ppo_micro_batch_size_per_gpu=32 reward_model.enable=True reward_model.model.path={model}
reward_model.use_reward_loop=False reward_model.model.use_remove_padding=True
reward_model.model.fsdp_config.param_offload=True reward_model.micro_batch_size_per_gpu=32
trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.default_local_dir={out}
"""

DAPO = """
algorithm.adv_estimator=grpo data.train_files={train} data.val_files={val} data.prompt_key=prompt
data.truncation=left data.max_prompt_length=2048 data.max_response_length=8192 data.train_batch_size=512
actor_rollout_ref.rollout.n=16 algorithm.use_kl_in_reward=False algorithm.kl_ctrl.kl_coef=0.0
actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.actor.kl_loss_coef=0.0
actor_rollout_ref.actor.clip_ratio_low=0.2 actor_rollout_ref.actor.clip_ratio_high=0.28
actor_rollout_ref.actor.clip_ratio_c=10.0 actor_rollout_ref.model.use_remove_padding=True
actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True
actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20480
actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=20480 actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=20480
actor_rollout_ref.model.path={model} actor_rollout_ref.model.enable_gradient_checkpointing=True
actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.optim.lr_warmup_steps=10
actor_rollout_ref.actor.optim.weight_decay=0.1 actor_rollout_ref.actor.ppo_mini_batch_size=32
actor_rollout_ref.actor.fsdp_config.param_offload=False actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
actor_rollout_ref.actor.entropy_coeff=0 actor_rollout_ref.actor.optim.clip_grad=1.0
actor_rollout_ref.actor.loss_agg_mode=token-mean actor_rollout_ref.actor.entropy_checkpointing=True
actor_rollout_ref.rollout.gpu_memory_utilization=0.80 actor_rollout_ref.rollout.tensor_model_parallel_size=4
actor_rollout_ref.rollout.enable_chunked_prefill=True actor_rollout_ref.rollout.max_num_batched_tokens=10240
actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.top_p=1.0 actor_rollout_ref.rollout.top_k=-1
actor_rollout_ref.rollout.val_kwargs.temperature=1.0 actor_rollout_ref.rollout.val_kwargs.top_p=0.7
actor_rollout_ref.rollout.val_kwargs.top_k=-1 actor_rollout_ref.rollout.val_kwargs.do_sample=True
actor_rollout_ref.rollout.val_kwargs.n=1 actor_rollout_ref.rollout.name=vllm
actor_rollout_ref.ref.fsdp_config.param_offload=False reward_model.reward_manager=dapo
+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True +reward_model.reward_kwargs.overlong_buffer_cfg.len=4096
+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0
+reward_model.reward_kwargs.overlong_buffer_cfg.log=False +reward_model.reward_kwargs.max_resp_len=8192
trainer.logger='["console","wandb"]' trainer.n_gpus_per_node=8 trainer.nnodes=1 trainer.val_before_train=True
trainer.test_freq=10 trainer.save_freq=-1 trainer.total_epochs=1 trainer.default_local_dir={out}
trainer.resume_mode=auto trainer.log_val_generations=10
"""

CISPO_GSPO_GMPO_SAPO = [
    """
algorithm.adv_estimator=grpo data.train_files={train} data.val_files={val} data.train_batch_size=256
actor_rollout_ref.model.path={model} actor_rollout_ref.actor.policy_loss.loss_mode=cispo
actor_rollout_ref.actor.clip_ratio_low=10 actor_rollout_ref.actor.clip_ratio_high=0.2
actor_rollout_ref.actor.ppo_mini_batch_size=64 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8
actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=8 trainer.n_gpus_per_node=2
trainer.default_local_dir={out}
""",
    """
algorithm.adv_estimator=grpo data.train_files={train} data.val_files={val} data.train_batch_size=256
actor_rollout_ref.model.path={model} actor_rollout_ref.actor.policy_loss.loss_mode=gspo
actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean actor_rollout_ref.actor.clip_ratio_low=0.0003
actor_rollout_ref.actor.clip_ratio_high=0.0004 actor_rollout_ref.actor.ppo_mini_batch_size=64
actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async
actor_rollout_ref.rollout.n=16 actor_rollout_ref.rollout.calculate_log_probs=True
actor_rollout_ref.actor.entropy_checkpointing=True actor_rollout_ref.ref.entropy_checkpointing=True
trainer.n_gpus_per_node=8 trainer.default_local_dir={out}
""",
    """
algorithm.adv_estimator=grpo data.train_files={train} data.val_files={val} data.train_batch_size=128
actor_rollout_ref.model.path={model} actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean
actor_rollout_ref.actor.clip_ratio_low=0.4 actor_rollout_ref.actor.clip_ratio_high=0.4
actor_rollout_ref.actor.ppo_mini_batch_size=32 actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=8
trainer.n_gpus_per_node=8 trainer.default_local_dir={out}
""",
    """
algorithm.adv_estimator=grpo data.train_files={train} data.val_files={val} data.train_batch_size=256
actor_rollout_ref.model.path={model} actor_rollout_ref.actor.policy_loss.loss_mode=sapo
actor_rollout_ref.actor.tau_pos=1.0 actor_rollout_ref.actor.tau_neg=1.05
actor_rollout_ref.actor.ppo_mini_batch_size=32 actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async
actor_rollout_ref.rollout.data_parallel_size=1 actor_rollout_ref.rollout.expert_parallel_size=1
actor_rollout_ref.actor.fsdp_config.strategy=fsdp trainer.use_legacy_worker_impl=disable
actor_rollout_ref.rollout.n=16 trainer.n_gpus_per_node=8 trainer.default_local_dir={out}
""",
]

OTHER_ENGINES = [
    """
algorithm.adv_estimator=grpo data.train_files={train} data.val_files={val} data.train_batch_size=64
actor_rollout_ref.model.path={model} actor_rollout_ref.actor.ppo_mini_batch_size=16
actor_rollout_ref.rollout.name=sglang actor_rollout_ref.rollout.mode=async
actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=triton actor_rollout_ref.rollout.n=4
+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=float32
+actor_rollout_ref.actor.fsdp_config.model_dtype=bfloat16 data.apply_chat_template_kwargs.reasoning_effort=medium
trainer.n_gpus_per_node=8 trainer.default_local_dir={out}
""",
    """
algorithm.adv_estimator=grpo data.train_files={train} data.val_files={val} data.train_batch_size=64
actor_rollout_ref.model.path={model} actor_rollout_ref.actor.ppo_mini_batch_size=16
actor_rollout_ref.rollout.name=trtllm actor_rollout_ref.rollout.mode=async actor_rollout_ref.rollout.max_num_seqs=1024
+actor_rollout_ref.rollout.engine_kwargs.trtllm.batch_wait_timeout_iters=32
actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=4096
trainer.n_gpus_per_node=8 trainer.default_local_dir={out}
""",
]

PROFILING_AND_SANDBOX = """
algorithm.adv_estimator=gae data.train_files={train} data.val_files={val} data.train_batch_size=256
actor_rollout_ref.model.path={model} actor_rollout_ref.actor.ppo_mini_batch_size=64
actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 critic.model.path={model} critic.ppo_micro_batch_size_per_gpu=8
global_profiler.tool=nsys global_profiler.steps='[1,2,5]' global_profiler.profile_continuous_steps=True
global_profiler.global_tool_config.nsys.discrete=True actor_rollout_ref.actor.profiler.enable=True
actor_rollout_ref.actor.profiler.all_ranks=False actor_rollout_ref.actor.profiler.ranks='[0,1]'
critic.profiler.enable=True critic.profiler.ranks='[0]'
reward_model.sandbox_fusion.url=https://sandbox.invalid/run_code reward_model.sandbox_fusion.max_concurrent=128
actor_rollout_ref.actor.use_prefix_grouper=True trainer.n_gpus_per_node=8 trainer.default_local_dir={out}
"""

ROLLOUT_CORRECTION_BYPASS = """
algorithm.adv_estimator=grpo data.train_files={train} data.val_files={val} data.train_batch_size=64
actor_rollout_ref.model.path={model} actor_rollout_ref.actor.ppo_mini_batch_size=16
algorithm.rollout_correction.rollout_is=token algorithm.rollout_correction.rollout_is_threshold=2.0
algorithm.rollout_correction.rollout_rs=\\'token_k1,seq_max_k2\\' algorithm.rollout_correction.rollout_rs_threshold=\\'0.6_1.6,2.5\\'
algorithm.rollout_correction.bypass_mode=true algorithm.rollout_correction.loss_type=ppo_clip
actor_rollout_ref.rollout.calculate_log_probs=True actor_rollout_ref.rollout.name=vllm
trainer.n_gpus_per_node=8 trainer.default_local_dir={out}
"""

# verl's deprecated global log-prob micro-batch size, and the vLLM sizes of its tuning recipes
DEPRECATED_NAMES = """
algorithm.adv_estimator=grpo data.train_files={train} data.val_files={val} data.train_batch_size=64
data.max_prompt_length=512 data.max_response_length=1024 actor_rollout_ref.model.path={model}
actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.ppo_micro_batch_size=64
actor_rollout_ref.rollout.log_prob_micro_batch_size=64 actor_rollout_ref.ref.log_prob_micro_batch_size=64
actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.max_model_len=1536
actor_rollout_ref.rollout.max_num_batched_tokens=1536 actor_rollout_ref.rollout.enable_chunked_prefill=false
actor_rollout_ref.rollout.load_format=safetensors trainer.n_gpus_per_node=8 trainer.default_local_dir={out}
"""

# examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh: adapters on the actor, the reference its base.
LORA = """
algorithm.adv_estimator=grpo trainer.val_before_train=False data.train_files={train} data.val_files={val}
data.train_batch_size=16 data.max_prompt_length=512 data.max_response_length=1024 data.filter_overlong_prompts=True
data.truncation=error data.shuffle=False actor_rollout_ref.model.path={model} actor_rollout_ref.model.lora_rank=64
actor_rollout_ref.model.lora_alpha=32 actor_rollout_ref.actor.optim.lr=3e-6 actor_rollout_ref.model.use_remove_padding=True
actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40
actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001
actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.entropy_coeff=0
actor_rollout_ref.model.enable_gradient_checkpointing=True actor_rollout_ref.actor.fsdp_config.param_offload=False
actor_rollout_ref.actor.fsdp_config.optimizer_offload=False actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40
actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.name=vllm
actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.n=5
actor_rollout_ref.rollout.load_format=safetensors actor_rollout_ref.rollout.layered_summon=True
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40 actor_rollout_ref.ref.fsdp_config.param_offload=True
algorithm.use_kl_in_reward=False trainer.critic_warmup=0 trainer.logger=["console","wandb"]
trainer.n_gpus_per_node=2 trainer.nnodes=1 trainer.save_freq=20 trainer.test_freq=5 trainer.total_epochs=15
trainer.default_local_dir={out}
"""

# verl's one-step-off recipe (verl/experimental/one_step_off_policy/shell/grpo_0.6b_gsm8k_fsdp2_2_6.sh): the
# rollout on 2 processes of its own, training on the other 6
ONE_STEP_OFF_PLACEMENT = """
algorithm.adv_estimator=grpo data.train_files={train} data.val_files={val} data.train_batch_size=1152
data.max_prompt_length=512 data.max_response_length=1024 data.filter_overlong_prompts=True data.truncation='error'
actor_rollout_ref.actor.strategy=fsdp2 critic.strategy=fsdp2 actor_rollout_ref.model.path={model}
actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.hybrid_engine=False actor_rollout_ref.model.use_remove_padding=True
actor_rollout_ref.actor.ppo_mini_batch_size=192 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32
actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001
actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.entropy_coeff=0
actor_rollout_ref.model.enable_gradient_checkpointing=True actor_rollout_ref.actor.fsdp_config.param_offload=False
actor_rollout_ref.actor.fsdp_config.optimizer_offload=False actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32
actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.name=vllm
actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.n=5
actor_rollout_ref.rollout.load_format=safetensors actor_rollout_ref.rollout.layered_summon=True
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32 actor_rollout_ref.ref.fsdp_config.param_offload=True
algorithm.use_kl_in_reward=False trainer.critic_warmup=0 trainer.val_before_train=True
trainer.logger=['console','tensorboard'] trainer.project_name=GRPO trainer.experiment_name=one-step-off-2-6
trainer.save_freq=-1 trainer.test_freq=5 trainer.total_epochs=2 trainer.nnodes=1 trainer.n_gpus_per_node=6
rollout.nnodes=1 rollout.n_gpus_per_node=2 trainer.default_local_dir={out}
"""

# verl's fully_async recipe (verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_4_4.sh), its entry point
# hybridrl's main_ppo with async_training.mode=streaming: 4 rollout processes, 4 training
FULLY_ASYNC = """
data.train_files={train} data.val_files={val} data.prompt_key=prompt data.truncation='left'
data.max_prompt_length=2048 data.max_response_length=8192 data.train_batch_size=0 data.gen_batch_size=1
data.return_raw_chat=True actor_rollout_ref.rollout.n=16 algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=False
algorithm.kl_ctrl.kl_coef=0.0 actor_rollout_ref.actor.strategy=fsdp2 critic.strategy=fsdp2
actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.actor.kl_loss_coef=0.0
actor_rollout_ref.actor.clip_ratio_low=0.2 actor_rollout_ref.actor.clip_ratio_high=0.28
actor_rollout_ref.actor.clip_ratio_c=10.0 actor_rollout_ref.model.use_remove_padding=True
actor_rollout_ref.hybrid_engine=False +actor_rollout_ref.model.override_config.max_position_embeddings=32768
actor_rollout_ref.actor.use_dynamic_bsz=True actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True
actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True actor_rollout_ref.actor.ppo_max_token_len_per_gpu=20480
actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=30720 actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=30720
actor_rollout_ref.model.path={model} actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.optim.lr_warmup_steps=10
actor_rollout_ref.actor.optim.weight_decay=0.1 actor_rollout_ref.actor.ppo_mini_batch_size=32
actor_rollout_ref.actor.fsdp_config.param_offload=False actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
actor_rollout_ref.actor.entropy_coeff=0 actor_rollout_ref.actor.grad_clip=1.0 actor_rollout_ref.actor.loss_agg_mode=token-mean
actor_rollout_ref.actor.ulysses_sequence_parallel_size=1 actor_rollout_ref.rollout.gpu_memory_utilization=0.80
actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.enable_chunked_prefill=True
actor_rollout_ref.rollout.max_num_batched_tokens=10240 actor_rollout_ref.rollout.temperature=1.0
actor_rollout_ref.rollout.top_p=1.0 actor_rollout_ref.rollout.top_k=-1 actor_rollout_ref.rollout.val_kwargs.temperature=1.0
actor_rollout_ref.rollout.val_kwargs.top_p=0.7 actor_rollout_ref.rollout.val_kwargs.top_k=-1
actor_rollout_ref.rollout.val_kwargs.do_sample=True actor_rollout_ref.rollout.val_kwargs.n=1
actor_rollout_ref.rollout.calculate_log_probs=True actor_rollout_ref.ref.fsdp_config.param_offload=True
actor_rollout_ref.ref.ulysses_sequence_parallel_size=1 actor_rollout_ref.actor.fsdp_config.fsdp_size=2
actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.mode=async reward_model.reward_manager=dapo
+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True +reward_model.reward_kwargs.overlong_buffer_cfg.len=4096
+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0 +reward_model.reward_kwargs.overlong_buffer_cfg.log=False
+reward_model.reward_kwargs.max_resp_len=8192 trainer.logger=['console','tensorboard'] trainer.project_name=DAPO
trainer.experiment_name=fully-async-4-4 trainer.val_before_train=False trainer.save_freq=-1
trainer.default_local_dir={out} trainer.resume_mode=auto trainer.nnodes=1 trainer.n_gpus_per_node=4 rollout.nnodes=1
rollout.n_gpus_per_node=4 rollout.total_rollout_steps=51200 rollout.total_epochs=10 rollout.test_freq=10
async_training.staleness_threshold=0.1 async_training.trigger_parameter_sync_step=4 async_training.require_batches=4
async_training.partial_rollout=True async_training.use_rollout_log_probs=True
"""

PASSING = {
    "grpo_vllm_async": GRPO_VLLM_ASYNC,
    "ppo_legacy_workers": PPO_LEGACY_WORKERS,
    # ppo_trainer/run_deepseek7b_llm_sp2.sh's Ulysses keys, the reference following the actor
    "ppo_ulysses": PPO_LEGACY_WORKERS + " actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"
                                        " critic.ulysses_sequence_parallel_size=2",
    "ppo_reward_loop": PPO_REWARD_LOOP,
    "ppo_legacy_reward_model": PPO_LEGACY_REWARD_MODEL,
    "dapo": DAPO,
    **{f"policy_loss_{i}": line for i, line in enumerate(CISPO_GSPO_GMPO_SAPO)},
    "sglang": OTHER_ENGINES[0],
    "trtllm": OTHER_ENGINES[1],
    "profiling_and_sandbox": PROFILING_AND_SANDBOX,
    "rollout_correction_bypass": ROLLOUT_CORRECTION_BYPASS,
    "deprecated_names": DEPRECATED_NAMES,
    "lora": LORA,
    "one_step_off_placement": ONE_STEP_OFF_PLACEMENT,
    # the recipe's own entry point is hybridrl's main_ppo with the mode key; the recipe YAML's weight_sync_with_ray
    "one_step_off_recipe": ONE_STEP_OFF_PLACEMENT + " async_training.mode=one_step_off trainer.weight_sync_with_ray=True",
    # with the script's hybrid sharding (fsdp_size=2 of 4 ranks)
    "fully_async_recipe": FULLY_ASYNC + " async_training.mode=streaming",
}

# Features hybridrl lacks: the error names the key and the missing feature.
REFUSED = {
    "critic_lora": (PPO_LEGACY_WORKERS + " critic.model.lora_rank=8",
                    "critic.model.lora_rank=8 is not supported by hybridrl: LoRA adapters train the actor only"),
    "reward_model_ulysses": (PPO_REWARD_LOOP + " reward_model.ulysses_sequence_parallel_size=2",
                             "reward_model.ulysses_sequence_parallel_size=2 is not supported by hybridrl"),
    "megatron": (GRPO_VLLM_ASYNC + " actor_rollout_ref.actor.strategy=megatron",
                 "actor_rollout_ref.actor.strategy=megatron is not supported by hybridrl"),
    "megatron_keys": (GRPO_VLLM_ASYNC + " actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                      "megatron.pipeline_model_parallel_size=2 is not supported by hybridrl: Megatron-LM is not "
                      "available"),
    "fsdp_size_not_dividing": (FULLY_ASYNC.replace("fsdp_size=2", "fsdp_size=3") + " async_training.mode=streaming",
                               "fsdp_size=3 must divide the world size \\(4\\) for hybrid sharding"),
    "fully_async_prox_log_prob": (FULLY_ASYNC + " async_training.mode=streaming async_training.compute_prox_log_prob=True",
                                  "async_training.compute_prox_log_prob=true is not supported by hybridrl"),
    "vision_language": (GRPO_VLLM_ASYNC + " data.image_key=images",
                        "data.image_key=images is not supported by hybridrl: vision-language models"),
}
