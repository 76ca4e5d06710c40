"""RLinf ``Worker`` subclasses only, each a thin adapter over the packages below it: the actor (``actor``), the
CPU and SGLang rollout engines (``rollout_hf``, ``rollout_sglang``), the agent loop (``agent_loop``), the reward
(``reward``) and the actor -> rollout weight sync payload and checks (``weight_sync``). Nothing is imported here:
importing a worker module imports Ray."""
