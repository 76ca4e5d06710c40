"""Shared set-up of the CPU runner tests (test_trainer_*.py): the tiny-cpu config with small overrides, and a
trainer on freshly launched worker groups. The Ray cluster is tests/runner/conftest.py's ``cluster``, the retrieval
server tests/conftest.py's ``retrieval_url``. Not a test module itself."""

from __future__ import annotations


def model_path(tiny_assets):
    # the base world's warm start searches and answers; fall back to the random tiny model if it is not built
    return tiny_assets.qwen2_tiny_sft_search or tiny_assets.qwen2_tiny


def make_cfg(tiny_assets, out_dir, url, **extra):
    from rlinf_ext.config.loader import load_config

    overrides = {
        "paths.tiny_assets": str(tiny_assets.root),
        "rollout.model.model_path": str(model_path(tiny_assets)),
        "runner.output_dir": str(out_dir),
        "runner.experiment_name": "t",
        "runner.max_steps": 1,
        "runner.save_interval": -1,
        "data.rollout_batch_size": 2,
        "data.train_data_paths": [str(tiny_assets.rlinf_train)],
        "data.val_data_paths": [],
        "algorithm.group_size": 2,
        "algorithm.n_minibatches": 2,
        "algorithm.training_batch_size_per_gpu": 1,
        "algorithm.logprob_forward_micro_batch_size": 2,
        "algorithm.kl_beta": 0.01,
        "algorithm.entropy_bonus": 0.001,
        "algorithm.sampling_params.max_new_tokens": 24,
        "agentloop.searchr1.max_turns": 1,
        "agentloop.response_length_total": 96,
        "agentloop.max_obs_length": 48,
        "actor.optim.lr": 1e-3,
        "retrieval.launch": False,
        "tools.search.server_addr": url.removeprefix("http://"),
        "tools.search.default_timeout": 20.0,
        "runner.seq_length": 1536,
        # the HF fallback engine: these tests check its exact logits after each sync and compare runs token for
        # token; the runner on vLLM is tests/e2e/test_reference_recipe.py
        "rollout.rollout_backend": "hf",
        **extra,
    }
    return load_config("tiny-cpu", [f"{k}={_yaml(v)}" for k, v in overrides.items()])


def _yaml(v):
    if isinstance(v, list):
        return "[" + ",".join(f"'{x}'" for x in v) + "]"
    if v is None:
        return "null"
    return str(v)


def make_trainer(cfg, cluster, url, on_step=None, data_size: int = 16):
    from transformers import AutoTokenizer

    from rlinf_ext.data.prompts import PromptDataset, load_jsonl_prompts
    from rlinf_ext.runner.compose import launch_worker_groups
    from rlinf_ext.runner.trainer import GRPOTrainer

    tok = AutoTokenizer.from_pretrained(cfg.rollout.model.model_path)
    rows = load_jsonl_prompts(cfg.data.train_data_paths, data_size=data_size)
    dataset = PromptDataset(rows, tok, cfg.data.max_prompt_length)
    total = GRPOTrainer.total_steps(cfg, len(dataset))
    groups = launch_worker_groups(cfg, cluster, total_train_steps=total, deterministic_rollout=True)
    return GRPOTrainer(cfg, groups, dataset, on_step=on_step)


def kill_groups(groups):
    from rlinf_ext.runner.groups import stop_worker_groups

    stop_worker_groups(groups)


def kill_group(*groups) -> None:
    """Kill the processes of RLinf worker groups a test launched itself (the shared Ray instance stays up)."""
    import ray

    for group in groups:
        for rank in group._workers:
            ray.kill(rank.worker, no_restart=True)
