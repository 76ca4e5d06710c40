"""The text policy and its math, in one process (no Ray): ``policy`` (Megatron-core GRPO policy), ``settings``
(what it reads from the config), ``logprobs`` (chunked next-token log-probs), ``optimizer`` (Megatron DDP and the
optimizer step, per device), ``rl_math``, ``batching``, ``lr_schedule``, ``data_parallel``, ``precision`` (CPU mixed
precision, offload helpers), ``checkpoint`` (the actor's file format) and ``policy_io`` (saving and restoring a
policy). ``workers/actor.py`` wraps it for Ray."""
