"""The run's batch order as a function of the data position (runner/data_order.py): each epoch a permutation
seeded by data.seed + epoch (torch's own generators, compared by hand), the last partial batch dropped, the
position after an epoch's last batch is the next epoch's first, and a checkpoint's position is refused for another
order."""

from __future__ import annotations

import pytest
import torch

from rlinf_ext.runner.data_order import BATCHES_READ, BatchOrder, load_position, save_position

ORDER = BatchOrder(dataset_len=7, batch_size=3, seed=5, shuffle=True, max_epochs=3)  # 2 batches per epoch, 1 dropped


def permutation(seed: int, n: int = 7) -> list[int]:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()


def test_epoch_e_is_the_permutation_seeded_by_seed_plus_e():
    for epoch in range(3):
        assert ORDER.epoch_indices(epoch) == permutation(5 + epoch)
    # epoch 0 is a RandomSampler seeded with data.seed: the order runs made before the position counter
    sampler = torch.utils.data.RandomSampler(range(7), generator=torch.Generator().manual_seed(5))
    assert list(sampler) == ORDER.epoch_indices(0)


def test_batch_i_is_its_epochs_slice_and_the_partial_batch_is_dropped():
    assert ORDER.batches_per_epoch == 2 and ORDER.total_batches == 6
    assert ORDER.batch_indices(0) == permutation(5)[0:3]
    assert ORDER.batch_indices(1) == permutation(5)[3:6]
    assert ORDER.batch_indices(2) == permutation(6)[0:3]  # the next epoch's first batch
    assert ORDER.batch_indices(5) == permutation(7)[3:6]
    unshuffled = BatchOrder(dataset_len=7, batch_size=3, seed=5, shuffle=False, max_epochs=2)
    assert [unshuffled.batch_indices(b) for b in range(4)] == [[0, 1, 2], [3, 4, 5]] * 2


@pytest.mark.parametrize("start", [0, 1, 2, 3, 5, 6])  # 2: an epoch boundary; 6: the end
def test_batches_from_a_position_are_the_runs_batches_from_there(start):
    dataset = [f"p{i}" for i in range(7)]
    got = list(ORDER.batches(dataset, start))
    assert [b for b, _ in got] == list(range(start, 6))
    assert all(items == [dataset[i] for i in ORDER.batch_indices(b)] for b, items in got)


def test_a_saved_position_loads_back_and_another_order_is_refused(tmp_path):
    path = tmp_path / "data.pt"
    save_position(ORDER, 4, path)
    assert torch.load(path, weights_only=True)[BATCHES_READ] == 4
    assert load_position(ORDER, path, trained_steps=3) == 4
    longer = BatchOrder(dataset_len=7, batch_size=3, seed=5, shuffle=True, max_epochs=9)  # more epochs: same order
    assert load_position(longer, path, trained_steps=3) == 4
    other = BatchOrder(dataset_len=8, batch_size=2, seed=5, shuffle=True, max_epochs=3)
    with pytest.raises(ValueError, match=r"dataset_len: 7 then, 8 now, batch_size: 3 then, 2 now.*runner.resume_dir"):
        load_position(other, path, trained_steps=3)


def test_an_older_loader_state_resumes_one_batch_per_trained_step_with_a_warning(tmp_path):
    path = tmp_path / "data.pt"
    torch.save({"_num_yielded": 2, "_sampler_iter_state": None}, path)  # a StatefulDataLoader state_dict's shape
    with pytest.warns(RuntimeWarning, match="older format: resuming at batch 3"):
        assert load_position(ORDER, path, trained_steps=3) == 3
