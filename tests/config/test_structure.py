"""Unknown keys, wrong types, missing values, composition and overrides."""

from __future__ import annotations

import pytest

from rlinf_ext.config import ConfigError, check_config, load_config
from rlinf_ext.config.compose import REPO_ROOT as REPO
from rlinf_ext.config.compose import ComposeError, compose_traced, parse_overrides
from rlinf_ext.config.structure import matches


def test_misspelt_key_suggests_the_right_one():
    result = check_config("tiny-cpu", ["algorithm.grop_size=4"])
    (issue,) = result.issues
    assert issue.key == "algorithm.grop_size"
    assert "unknown key" in issue.reason
    assert "algorithm.group_size" in issue.fix


def test_two_bad_keys_reported_in_one_run():
    result = check_config("tiny-cpu", ["rollout.detokenise=true", "data.rolout_batch_size=8"])
    by_key = {i.key: i for i in result.issues}
    assert set(by_key) == {"rollout.detokenise", "data.rolout_batch_size"}
    assert "rollout.detokenize" in by_key["rollout.detokenise"].fix
    assert "data.rollout_batch_size" in by_key["data.rolout_batch_size"].fix


def test_unknown_section_and_key_in_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("defaults:\n  - tiny-cpu\nrolout:\n  detokenize: true\nrunner:\n  seq_lenght: 10\n")
    # a relative defaults entry is resolved next to the file: tiny-cpu is not there
    assert check_config(path).issues[0].key.startswith("defaults")
    base = "examples/searchr1/config/tiny-cpu.yaml"
    from rlinf_ext.config.compose import REPO_ROOT

    path.write_text(f"defaults:\n  - {REPO_ROOT / base}\nrolout:\n  detokenize: true\nrunner:\n  seq_lenght: 10\n")
    by_key = {i.key: i for i in check_config(path).issues}
    assert "did you mean rollout" in by_key["rolout"].fix
    assert "runner.seq_length" in by_key["runner.seq_lenght"].fix


def test_wrong_types():
    result = check_config(
        "tiny-cpu",
        [
            "data.rollout_batch_size=eight",
            "rollout.detokenize=maybe",
            "rollout.rollout_backend=tgi",
            "data.val_data_paths=x.jsonl",
        ],
    )
    by_key = {i.key: i for i in result.issues}
    assert "expected int" in by_key["data.rollout_batch_size"].reason
    assert "expected bool" in by_key["rollout.detokenize"].reason
    assert "'vllm' | 'hf' | 'sglang'" in by_key["rollout.rollout_backend"].reason
    assert "allowed: vllm, hf, sglang" in by_key["rollout.rollout_backend"].fix
    assert "list[str]" in by_key["data.val_data_paths"].reason
    assert len(result.issues) == 4  # rules reading bad keys are skipped, not reported twice


def test_section_replaced_by_scalar():
    (issue,) = check_config("tiny-cpu", ["tools.search=3"]).issues
    assert issue.key == "tools.search" and "mapping" in issue.reason


def test_missing_required_value(tmp_path):
    path = tmp_path / "partial.yaml"
    path.write_text("defaults: [defaults/searchr1, model/qwen2-tiny, cluster/cpu]\n")
    by_key = {i.key: i for i in check_config(path).issues}
    for key in ("runner.seq_length", "runner.experiment_name", "algorithm.group_size", "data.rollout_batch_size"):
        assert "missing" in by_key[key].reason and f"{key}=" in by_key[key].fix
    # rules reading the missing values are skipped instead of failing
    assert all("seq_length" not in i.reason for k, i in by_key.items() if k != "runner.seq_length")


def test_bad_interpolation_is_reported():
    (issue,) = check_config("tiny-cpu", ["runner.output_dir=${runner.nope}"]).issues
    assert issue.key == "runner.output_dir" and "resolve" in issue.reason


def test_load_config_raises_with_all_issues():
    with pytest.raises(ConfigError) as err:
        load_config("tiny-cpu", ["a.b=1", "algorithm.group_size=1", "algorithm.training_batch_size_per_gpu=4"])
    assert len(err.value.issues) == 2
    assert "  - a: unknown key" in str(err.value) and "algorithm.group_size" in str(err.value)
    cfg = load_config("tiny-cpu", ["algorithm.group_size=1"], strict=False)
    assert cfg.algorithm.group_size == 1


def test_unknown_config_name_lists_known():
    (issue,) = check_config("tiny-gpu").issues
    assert "tiny-cpu" in issue.fix


def test_bad_defaults_entry_lists_options(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("defaults:\n  - cluster: 2node\n")
    (issue,) = check_config(path).issues
    assert "1node-8gpu" in issue.fix and "cpu" in issue.fix


def test_circular_defaults(tmp_path):
    (tmp_path / "a.yaml").write_text("defaults: [b.yaml]\n")
    (tmp_path / "b.yaml").write_text("defaults: [a.yaml]\n")
    (issue,) = check_config(tmp_path / "a.yaml").issues
    assert "circular" in issue.reason


def test_self_position_controls_precedence(tmp_path):
    from rlinf_ext.config.compose import compose

    (tmp_path / "base.yaml").write_text("runner:\n  seed: 1\n")
    (tmp_path / "first.yaml").write_text("defaults: [_self_, base.yaml]\nrunner:\n  seed: 2\n")
    (tmp_path / "last.yaml").write_text("defaults: [base.yaml]\nrunner:\n  seed: 2\n")
    assert compose(tmp_path / "first.yaml").runner.seed == 1
    assert compose(tmp_path / "last.yaml").runner.seed == 2


def test_override_parsing():
    cfg = parse_overrides(
        [
            "data.val_data_paths=[a.jsonl,b.jsonl]",
            "runner.resume_dir=null",
            "rollout.detokenize=false",
            "algorithm.kl_beta=1e-3",
            "runner.experiment_name=x=y",
        ]
    )
    assert list(cfg.data.val_data_paths) == ["a.jsonl", "b.jsonl"]
    assert cfg.runner.resume_dir is None and cfg.rollout.detokenize is False
    assert cfg.algorithm.kl_beta == 0.001 and cfg.runner.experiment_name == "x=y"
    for bad in ["novalue", "=3", " a=1", "data.val_data_paths=[a,"]:
        with pytest.raises(ComposeError):
            parse_overrides([bad])


def test_overrides_apply_last():
    cfg = load_config("tiny-cpu", ["data.val_data_paths=[a.jsonl,b.jsonl]", "data.rollout_batch_size=16"])
    assert cfg.data.val_data_paths == ["a.jsonl", "b.jsonl"] and cfg.data.rollout_batch_size == 16


@pytest.mark.parametrize(
    "value, tp_name, ok",
    [(1, "int", True), (True, "int", False), (1, "float", True), ("1", "float", False), ([], "list", True)],
)
def test_type_matching(value, tp_name, ok):
    tp = {"int": int, "float": float, "list": list[str]}[tp_name]
    assert matches(value, tp) is ok


def test_every_schema_field_has_help():
    import dataclasses

    from rlinf_ext.config.schema import ExperimentConfig

    def walk(cls):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"
            sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
            if isinstance(sub, type) and dataclasses.is_dataclass(sub):
                yield from walk(sub)
            yield f

    assert len(list(walk(ExperimentConfig))) > 150


def test_wrong_value_reported_once_not_at_interpolating_keys():
    # actor.micro_batch_size interpolates algorithm.training_batch_size_per_gpu; compat keys follow runner.seq_length
    (issue,) = check_config("tiny-cpu", ["runner.seq_length=long"]).issues
    assert issue.key == "runner.seq_length" and "expected int" in issue.reason


def test_misspelt_choice_suggests_the_right_one():
    (issue,) = check_config("tiny-cpu", ["algorithm.adv_type=gpro"]).issues
    assert "did you mean algorithm.adv_type=grpo?" in issue.fix


def test_defaults_mapping_form_and_group_path(tmp_path):
    from rlinf_ext.config.compose import compose

    (tmp_path / "x.yaml").write_text("defaults:\n  - cluster: cpu\n  - /model/qwen2-tiny\nrunner:\n  seed: 7\n")
    cfg = compose(tmp_path / "x.yaml")
    assert cfg.cluster.num_gpus_per_node == 0 and cfg.actor.model.num_attention_heads == 2
    assert cfg.runner.seed == 7


def test_every_bad_override_reported():
    issues = check_config("tiny-cpu", ["novalue", "data.val_data_paths=[a,", "runner.seed=3"]).issues
    assert [i.key for i in issues] == ["novalue", "data.val_data_paths"]


def test_an_error_names_the_layer_file_the_key_came_from(tmp_path):
    (tmp_path / "shared.yaml").write_text("rollout:\n  detokenise: true\nrunner:\n  seq_length: long\n")
    path = tmp_path / "exp.yaml"
    path.write_text(
        "defaults: [defaults/searchr1, model/qwen2-tiny, cluster/cpu, shared.yaml, _self_]\n"
        "runner:\n  max_steps: often\n"
    )
    by_key = {i.key: i for i in check_config(path, ["algorithm.group_size=two"]).issues}
    assert by_key["rollout.detokenise"].reason.endswith(f"(set in {tmp_path / 'shared.yaml'})")  # unknown key
    assert by_key["runner.seq_length"].reason.endswith(f"(set in {tmp_path / 'shared.yaml'})")  # wrong type
    assert by_key["runner.max_steps"].reason.endswith(f"(set in {path})")
    assert by_key["algorithm.group_size"].reason.endswith("(set in a command-line override)")
    assert "(set in" not in by_key["runner.experiment_name"].reason  # ???: only the schema sets it


def test_searchr1_and_arith_compose_the_text_agent_layer():
    _, origins = compose_traced("tiny-cpu", ["runner.max_steps=3"])
    assert origins["algorithm.kl_beta"] == origins["data.prompt_key"] == "configs/defaults/text_agent.yaml"
    assert origins["algorithm.sampling_params.stop"] == "configs/defaults/searchr1.yaml"
    assert origins["runner.max_steps"] == "a command-line override"
    _, origins = compose_traced(REPO / "examples/plugins/arith/arith-tiny.yaml")
    assert origins["algorithm.adv_type"] == "configs/defaults/text_agent.yaml"
