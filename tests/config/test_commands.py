"""CLI verbs validate / show / plan through rlinf_ext.cli.main."""

from __future__ import annotations

import pytest
import yaml

from rlinf_ext.cli import main

# The GPU example YAMLs (and these tests' SGLang wiring) name rollout_backend=sglang, which validate accepts only
# where the SGLang profile is installed (tests/config/test_sglang_profile.py): validate as there.
pytestmark = pytest.mark.usefixtures("sglang_profile_installed")


def plan_rows(out: str) -> dict[str, str]:
    """The batch arithmetic block as label -> value (labels and values are separated by 2+ spaces)."""
    import re

    block = out.split("batch arithmetic (per rollout step):")[1].strip().split("\n\n")[0]  # up to the memory section
    return dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in block.splitlines())


def placement_rows(out: str) -> list[list[str]]:
    block = out.split("placement:")[1].split("batch arithmetic")[0]
    return [
        line.split() for line in block.strip().splitlines()[1:] if not line.strip().startswith("actor and rollout:")
    ]


def test_validate_exit_codes(reference_env, capsys):
    assert main(["validate", "qwen2.5-3b-tool-1node"]) == 0
    assert "valid" in capsys.readouterr().out
    assert main(["validate", "tiny-cpu", "rollout.detokenise=true", "tools.search.topk=0"]) == 1
    err = capsys.readouterr().err
    assert "2 problem(s)" in err and "rollout.detokenize" in err and "tools.search.topk" in err


def test_validate_missing_env(no_reference_env, capsys):
    assert main(["validate", "qwen2.5-3b-tool-1node"]) == 1
    assert "RLINF_EXT_QWEN25_3B" in capsys.readouterr().err


def test_validate_check_paths(reference_env, capsys):
    assert main(["validate", "qwen2.5-3b-tool-1node", "--check-paths"]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_show_prints_resolved_yaml(reference_env, capsys):
    assert main(["show", "qwen2.5-3b-tool-1node", "data.rollout_batch_size=256"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["data"]["rollout_batch_size"] == 256
    assert shown["actor"]["model"]["seq_length"] == 7096  # interpolation resolved
    assert "${" not in str(shown)


def test_plan_reference(no_reference_env, capsys):
    """plan needs no model or data: it works on a fresh machine."""
    assert main(["plan", "qwen2.5-3b-tool-1node"]) == 0
    out = capsys.readouterr().out
    assert "1 node(s) x 8 GPU(s)" in out
    assert placement_rows(out) == [[comp, "0", "0-7", "8", "1", "1", "8"] for comp in ("actor", "rollout", "reward")]
    assert "actor and rollout: collocated" in out
    rows = plan_rows(out)
    assert rows["prompts/step"] == "512" and rows["group size"] == "4"
    assert rows["trajectories/step"] == "512 x 4 = 2048"
    assert rows["trajectories/minibatch"] == "2048 / 2 = 1024"
    assert rows["actor data-parallel size"] == "8"
    assert rows["micro-batches/DP rank/minibatch"] == "128"
    assert rows["optimizer steps/rollout step"] == "2"
    assert rows["prompts/engine"] == "512 / 8 = 64"


def test_plan_disaggregated_two_nodes(reference_env, capsys):
    assert (
        main(
            [
                "plan",
                "qwen2.5-3b-tool-1node",
                "cluster.num_nodes=2",
                "cluster.component_placement={actor: 4-11, 'rollout,reward': 12-15}",
                "actor.model.tensor_model_parallel_size=2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert placement_rows(out) == [
        ["actor", "0", "4-7", "8", "2", "1", "4"],
        ["actor", "1", "0-3", "8", "2", "1", "4"],
        ["rollout", "1", "4-7", "4", "1", "1", "4"],
        ["reward", "1", "4-7", "4", "1", "1", "4"],
    ]
    assert "actor and rollout: disaggregated" in out
    rows = plan_rows(out)
    assert rows["actor data-parallel size"] == "4"  # 8 GPUs / TP 2
    assert rows["micro-batches/DP rank/minibatch"] == "256"  # 1024 / 4 ranks / micro-batch 1
    assert rows["prompts/engine"] == "512 / 4 = 128"


def test_unknown_config(capsys):
    assert main(["validate", "nope"]) == 1
    assert "tiny-cpu" in capsys.readouterr().err


def test_plan_eval_has_no_optimizer_steps(reference_env, capsys):
    assert main(["plan", "qwen2.5-3b-tool-1node-eval"]) == 0
    out = capsys.readouterr().out
    assert [row[0] for row in placement_rows(out)] == ["rollout", "reward"]
    assert plan_rows(out)["optimizer steps/rollout step"] == "0 (evaluation)"
