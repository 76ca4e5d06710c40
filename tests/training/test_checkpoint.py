import pytest
import torch

from rlinf_ext.convert.mg_checkpoint import (
    discover_ranks,
    load_rank_file,
    resolve_iteration_dir,
    save_rank_file,
    write_tracker,
)
from rlinf_ext.runner.checkpoints import check_complete, finalize, latest_complete_checkpoint, staging_dir, step_of
from rlinf_ext.training.checkpoint import actor_rank_file, load_actor_checkpoint, save_actor_checkpoint

RANK = "actor/iter_{:07d}/mp_rank_00/model_optim_rng.pt"


def _write(root, step, payload=b"x" * 100):
    tmp = staging_dir(root, step)
    (tmp / "actor").mkdir()
    (tmp / "actor" / "model_optim_rng.pt").write_bytes(payload)
    (tmp / "data").mkdir()
    (tmp / "data" / "data.pt").write_bytes(b"d")
    return finalize(tmp, step)


def _save_actor(actor_dir, step, scale=1.0):
    model = {
        "embedding.word_embeddings.weight": torch.full((4, 2), scale),
        "decoder.final_layernorm.weight": torch.ones(2),
    }
    optimizer = {
        "state": {0: {"step": torch.tensor(float(step)), "exp_avg": torch.zeros(4, 2)}},
        "param_groups": [{"lr": 1e-3, "params": [0]}],
    }
    return save_actor_checkpoint(
        actor_dir,
        step,
        model,
        optimizer=optimizer,
        opt_param_scheduler={"num_steps": 2 * step},
        rng_state=[{"torch_rng_state": torch.get_rng_state()}],
    )


def test_latest_complete_and_truncation_skipped(tmp_path):
    _write(tmp_path, 1)
    _write(tmp_path, 2)
    newest = _write(tmp_path, 3)
    assert latest_complete_checkpoint(tmp_path).name == "global_step_3"
    # truncate a file of the newest one: it must be skipped with a warning
    (newest / "actor" / "model_optim_rng.pt").write_bytes(b"x" * 10)
    assert "truncated" in check_complete(newest)
    with pytest.warns(RuntimeWarning, match="global_step_3"):
        assert latest_complete_checkpoint(tmp_path).name == "global_step_2"
    # a half-written staging dir is never picked, a dir without marker is skipped
    staging_dir(tmp_path, 4)
    (tmp_path / "global_step_5").mkdir()
    with pytest.warns(RuntimeWarning) as record:
        assert latest_complete_checkpoint(tmp_path).name == "global_step_2"
    assert any("marker" in str(w.message) for w in record) and any("truncated" in str(w.message) for w in record)
    assert step_of(tmp_path / "global_step_2") == 2


def test_refinalize_replaces_and_empty_root(tmp_path):
    assert latest_complete_checkpoint(tmp_path / "none") is None
    _write(tmp_path, 1, b"a")
    final = _write(tmp_path, 1, b"bb")
    assert (final / "actor" / "model_optim_rng.pt").read_bytes() == b"bb"
    assert check_complete(final) is None


def test_actor_checkpoint_is_megatron_layout_and_truncation_is_caught(tmp_path):
    root = tmp_path / "checkpoints"
    for step in (1, 2):
        tmp = staging_dir(root, step)
        path = _save_actor(tmp / "actor", step, scale=float(step))
        assert path == actor_rank_file(tmp / "actor", step)
        finalize(tmp, step)
    newest = root / "global_step_2"
    assert (newest / "actor" / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert check_complete(newest) is None
    # one file holds model + iteration (what converters read) and the training state (what resume reads)
    ckpt = load_actor_checkpoint(newest / "actor")
    assert ckpt["iteration"] == 2 and ckpt["checkpoint_version"] == 3.0
    assert torch.equal(ckpt["model"]["embedding.word_embeddings.weight"], torch.full((4, 2), 2.0))
    assert ckpt["optimizer"]["state"][0]["step"] == 2 and ckpt["opt_param_scheduler"]["num_steps"] == 4
    assert ckpt["rlinf_ext"]["format"] == "megatron-legacy-tp1pp1" and "torch_rng_state" in ckpt["rng_state"][0]
    # the converters' reader (convert/mg2hf.py) finds the same model state through the tracker file
    layout = discover_ranks(resolve_iteration_dir(newest / "actor"))
    assert (layout.tp, layout.pp) == (1, 1)
    mg = load_rank_file(layout.rank_file(0, 0))
    assert set(mg) == set(ckpt["model"])

    # a truncated rank file: the manifest catches it and resume falls back to the previous step
    rank = newest / RANK.format(2)
    rank.write_bytes(rank.read_bytes()[:200])
    assert "truncated" in check_complete(newest) and RANK.format(2) in check_complete(newest)
    with pytest.warns(RuntimeWarning, match="global_step_2"):
        assert latest_complete_checkpoint(root).name == "global_step_1"
    with pytest.raises(ValueError, match="truncated or corrupt"):  # read directly, it still fails clearly
        load_actor_checkpoint(newest / "actor")
    # a missing tracker file is caught by the manifest as well
    (root / "global_step_1" / "actor" / "latest_checkpointed_iteration.txt").unlink()
    assert "missing file actor/latest_checkpointed_iteration.txt" in check_complete(root / "global_step_1")


def test_actor_checkpoint_errors(tmp_path):
    with pytest.raises(ValueError, match="iteration must be >= 1"):
        _save_actor(tmp_path / "zero", 0)
    old = tmp_path / "old"
    old.mkdir()
    (old / "model.pt").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="old layout"):
        load_actor_checkpoint(old)
    with pytest.raises(FileNotFoundError, match="not an actor checkpoint"):
        load_actor_checkpoint(tmp_path)
    weights_only = tmp_path / "hf2mg"  # what hf2mg writes: converters read it, resume cannot
    save_rank_file(weights_only / "release" / "mp_rank_00" / "model_optim_rng.pt", {"w": torch.ones(1)}, None)
    write_tracker(weights_only, None)
    with pytest.raises(ValueError, match="cannot resume training"):
        load_actor_checkpoint(weights_only)
    with pytest.raises(ValueError, match="extra may not set"):
        save_rank_file(tmp_path / "x.pt", {}, 1, extra={"model": {}})
