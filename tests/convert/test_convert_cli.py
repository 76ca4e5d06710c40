"""`rlinf-ext convert` and the toolkit shell scripts, run as users run them (subprocesses, other cwd)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "toolkits" / "ckpt_convertor" / "megatron_convertor"


def _env():
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("PYTHONPATH", None)
    return env


def _run(cmd, cwd, timeout=240):
    return subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(300)
def test_hf2mg_script_runs_from_another_directory(qwen2_models, tmp_path):
    src = qwen2_models[("tied", "bf16")]
    work = tmp_path / "elsewhere"
    work.mkdir()
    # relative output paths are resolved against the caller's directory, not the script's
    r = _run(["sh", str(SCRIPTS / "hf2mg_3b.sh"), str(src), "mg_out", "2", "1", "--quiet"], cwd=work)
    assert r.returncode == 0, r.stderr
    assert (work / "mg_out" / "latest_checkpointed_iteration.txt").read_text() == "release"
    assert (work / "mg_out" / "release" / "mp_rank_01" / "model_optim_rng.pt").is_file()
    assert not (SCRIPTS / "mg_out").exists()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_mg2hf_script_runs_from_another_directory(shell, qwen2_models, read_weights, tmp_path):
    from rlinf_ext.convert.hf2mg import convert_hf_to_mg

    src = qwen2_models[("tied", "bf16")]
    actor = tmp_path / "ckpts" / "global_step_3" / "actor"
    convert_hf_to_mg(src, actor, tp=2, pp=1, iteration=3, progress=False)
    work = tmp_path / "elsewhere"
    work.mkdir()
    r = _run(
        [shell, str(SCRIPTS / "mg2hf_3b.sh"), "../ckpts/global_step_3/actor", "hf_out", str(src), "--quiet"], cwd=work
    )
    assert r.returncode == 0, r.stderr
    assert "TP=2, PP=1" in r.stdout
    out, ref = read_weights(work / "hf_out"), read_weights(src)
    assert set(out) == set(ref) and all(torch.equal(out[k], ref[k]) for k in ref)
    assert not (SCRIPTS / "hf_out").exists()


@pytest.mark.timeout(60)
def test_scripts_print_usage():
    for script in ("mg2hf_3b.sh", "hf2mg_3b.sh"):
        r = _run(["sh", str(SCRIPTS / script)], cwd="/")
        assert r.returncode == 2 and f"usage: {script}" in r.stderr
        r = _run(["bash", str(SCRIPTS / script), "--help"], cwd="/")
        assert r.returncode == 0 and f"usage: {script}" in r.stdout


@pytest.mark.timeout(300)
def test_cli_mg2hf_verify_prints_logit_difference(qwen2_models, tmp_path, capsys):
    from rlinf_ext.cli import main

    src = qwen2_models[("untied", "fp32")]
    assert (
        main(["convert", "hf2mg", "--hf", str(src), "--out", str(tmp_path / "mg"), "--tp", "2", "--pp", "2", "--quiet"])
        == 0
    )
    rc = main(
        [
            "convert",
            "mg2hf",
            "--mg",
            str(tmp_path / "mg"),
            "--out",
            str(tmp_path / "hf"),
            "--hf-template",
            str(src),
            "--verify",
            "--quiet",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    line = next(s for s in out.splitlines() if s.startswith("verify:"))
    diff = float(line.split("= ")[1].split()[0])
    assert diff < 1e-4 and line.endswith("OK")
    # a wrong conversion is caught: swap two q heads in the HF output, verify must fail
    from safetensors.torch import load_file, save_file

    shard = next((tmp_path / "hf").glob("model-*.safetensors"))
    state = load_file(str(shard))
    q = state["model.layers.1.self_attn.q_proj.weight"]
    state["model.layers.1.self_attn.q_proj.weight"] = torch.cat([q[16:32], q[:16], q[32:]])
    save_file(state, str(shard), metadata={"format": "pt"})
    from rlinf_ext.convert.verify import verify_conversion

    bad = verify_conversion(tmp_path / "mg", tmp_path / "hf")
    assert not bad.ok and bad.max_abs_diff > 1e-2


@pytest.mark.timeout(120)
def test_cli_errors_exit_1_with_the_reason(qwen2_models, tmp_path, capsys):
    from rlinf_ext.cli import main

    src = qwen2_models[("tied", "fp32")]
    assert main(["convert", "hf2mg", "--hf", str(src), "--out", str(tmp_path / "mg"), "--tp", "3", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "error: --tp 3 --pp 1 does not fit" in err and "not divisible by TP=3" in err
    assert (
        main(["convert", "mg2hf", "--mg", str(tmp_path), "--out", str(tmp_path / "hf"), "--hf-template", str(src)]) == 1
    )
    assert "not a Megatron checkpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["convert", "mg2hf", "--help"])
    assert exc.value.code == 0 and "--hf-template" in capsys.readouterr().out
