"""The text policy and its math, in one process (no Ray): ``policy`` (Megatron-core GRPO policy), ``settings``
(what it reads from the config), ``rl_math``, ``batching``, ``lr_schedule``, ``data_parallel``, ``precision``
(mixed precision, offload) and ``checkpoint`` (the actor's file format). ``workers/actor.py`` wraps it for Ray."""
