import pytest
import torch

from rlinf_ext.training.batching import gather_logprobs, pack_sequences, response_scatter, response_slice
from rlinf_ext.training.lr_schedule import lr_at


def test_pack_layout_and_masks():
    b = pack_sequences([[1, 2], [3]], [[4, 5, 6], [7]], [[1, 0, 1], [1]], pad_id=0)
    assert b.input_ids.tolist() == [[1, 2, 4, 5, 6], [3, 7, 0, 0, 0]]
    # column t predicts token t+1: row 0 predicts 4 (col 1, mask 1), 5 (col 2, observation), 6 (col 3)
    assert b.loss_mask.tolist() == [[0, 1, 0, 1], [1, 0, 0, 0]]
    assert b.num_tokens == 7
    vals = torch.arange(8.0).view(2, 4)
    sl = response_slice(vals, b)
    assert sl.tolist() == [[1, 2, 3], [4, 0, 0]]
    assert response_scatter(sl, b).tolist() == [[0, 1, 2, 3], [4, 0, 0, 0]]


def test_pack_rejects_bad_input():
    with pytest.raises(ValueError, match="response_mask"):
        pack_sequences([[1]], [[2, 3]], [[1]], 0)
    with pytest.raises(ValueError, match="empty prompt"):
        pack_sequences([[]], [[2]], [[1]], 0)


def test_gather_logprobs_matches_manual():
    logits = torch.randn(1, 3, 5)
    ids = torch.tensor([[0, 4, 2]])
    lp = gather_logprobs(logits, ids)
    manual = [torch.log_softmax(logits[0, t], -1)[ids[0, t + 1]].item() for t in range(2)]
    assert lp[0].tolist() == pytest.approx(manual, abs=1e-6)


def test_lr_schedule_shapes():
    # 10 steps, 20% warmup -> 2 warmup steps: lr/2, lr; then linear to min_lr at step 9
    assert lr_at(0, 10, 1.0, 0.2, "linear", 0.0) == pytest.approx(0.5)
    assert lr_at(1, 10, 1.0, 0.2, "linear", 0.0) == pytest.approx(1.0)
    assert lr_at(2, 10, 1.0, 0.2, "linear", 0.0) == pytest.approx(1.0)
    assert lr_at(9, 10, 1.0, 0.2, "linear", 0.1) == pytest.approx(0.1)
    assert lr_at(5, 10, 1.0, 0.0, "constant", 0.0) == 1.0
    mid = lr_at(5, 11, 1.0, 0.0, "cosine", 0.0)  # progress 0.5 -> half
    assert mid == pytest.approx(0.5)
    assert lr_at(10, 11, 1.0, 0.0, "cosine", 0.0) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="lr_decay_style"):
        lr_at(0, 10, 1.0, 0.0, "exp", 0.0)
