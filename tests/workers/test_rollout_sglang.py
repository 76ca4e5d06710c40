"""The SGLang rollout worker's CPU-testable parts (the worker itself needs a GPU): the post-sync probe check, and how
received buckets become SGLang's ``update_weights_from_tensor`` request, checked by opening the handles the way
SGLang's scheduler does (``_unwrap_tensor``: ``LocalSerializedTensor.values[tp_rank]``)."""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import pytest
import torch

from rlinf_ext.workers.rollout_sglang import probe_logprob_gap, slot_handles, update_request_tensors
from rlinf_ext.sync.weight_sync import WeightSyncError, pack_buckets, prepare_handles, share_bucket


def test_probe_logprob_gap_compares_engine_and_actor():
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (1, 6))
    logits = torch.randn(1, 6, 50) * 3
    exact = torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()
    entries = [(None, int(ids[0, 0]), None)] + [(lp, int(t), None) for lp, t in zip(exact, ids[0, 1:])]
    assert probe_logprob_gap(ids, logits, entries) < 1e-5
    shifted = [entries[0]] + [(lp + 1.0, t, x) for lp, t, x in entries[1:]]
    assert probe_logprob_gap(ids, logits, shifted) == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(WeightSyncError, match="probe log-probs"):
        probe_logprob_gap(ids, logits, entries[:-1])
    # the multimodal probe compares only the text after its image: a gap on the image's positions is not counted
    image_off = [entries[0]] + [(lp + (5.0 if k < 2 else 0.0), t, x) for k, (lp, t, x) in enumerate(entries[1:])]
    assert probe_logprob_gap(ids, logits, image_off, positions=[3, 4, 5]) < 1e-5
    assert probe_logprob_gap(ids, logits, image_off, positions=[2, 3]) == pytest.approx(2.5, abs=1e-5)


@dataclass
class LocalSerializedTensor:  # SGLang 0.4.6.post5's class, field for field (model_runner.py)
    values: list[bytes]

    def get(self, rank: int):
        return pickle.loads(self.values[rank])


def scheduler_view(named, tp_rank: int) -> dict[str, torch.Tensor]:
    """What SGLang's TP scheduler ``tp_rank`` loads: the request round-trips through pickle (its
    MultiprocessingSerializer), then each LocalSerializedTensor is opened at the scheduler's rank."""
    received = pickle.loads(pickle.dumps(named))
    return {name: value.get(tp_rank) for name, value in received}


def buckets_of(state: dict[str, torch.Tensor]):
    return list(pack_buckets(state.items(), max_bytes=1 << 20, shared=True))


def test_each_tp_scheduler_opens_the_handle_of_its_own_slot():
    """Paired route, an engine of TP 2: slot k's handles come from the actor rank on GPU k, and TP rank k opens
    exactly those (marked here by giving each slot different values)."""
    prepare_handles(torch.device("cpu"))
    slot0 = share_bucket(buckets_of({"a": torch.zeros(3), "b": torch.zeros(2, 2)})[0])
    slot1 = share_bucket(buckets_of({"a": torch.ones(3), "b": torch.ones(2, 2)})[0])
    slots, keep_alive = slot_handles([slot0, slot1], 2, to_device=None)
    assert slots == [slot0, slot1] and keep_alive == []
    named = update_request_tensors(slots, LocalSerializedTensor)
    assert [n for n, _ in named] == ["a", "b"]
    for rank, fill in ((0, 0.0), (1, 1.0)):
        view = scheduler_view(named, rank)
        assert torch.equal(view["a"], torch.full((3,), fill)) and torch.equal(view["b"], torch.full((2, 2), fill))
    with pytest.raises(WeightSyncError, match="TP size 3"):
        slot_handles([slot0, slot1], 3, to_device=None)
    other = share_bucket(buckets_of({"c": torch.zeros(3)})[0])
    with pytest.raises(WeightSyncError, match="different buckets"):
        update_request_tensors([slot0, other], LocalSerializedTensor)


def test_a_broadcast_bucket_is_copied_to_every_tp_device_before_sharing():
    """Broadcast route: the bucket arrives once (on the worker's first GPU); each TP slot gets its own copy
    (``to_device(flat, slot)``), so no scheduler opens memory on another GPU."""
    prepare_handles(torch.device("cpu"))
    bucket = buckets_of({"w": torch.arange(6.0).view(2, 3), "bias": torch.arange(2.0)})[0]
    moved = []

    def to_device(flat, slot):
        moved.append(slot)
        return (flat + slot * 100).share_memory_()  # stands in for flat.to(f"cuda:{slot}")

    slots, keep_alive = slot_handles([bucket], 2, to_device)
    assert moved == [0, 1] and len(keep_alive) == 2
    named = update_request_tensors(slots, LocalSerializedTensor)
    assert torch.equal(scheduler_view(named, 0)["w"], torch.arange(6.0).view(2, 3))
    assert torch.equal(scheduler_view(named, 1)["bias"], torch.arange(2.0) + 100)


def test_training_requests_keep_the_config_temperature_and_stop_at_every_eos():
    """R11: a request that names no temperature samples at the configured one (not SGLang's 1.0); R8: the HF EOS
    set (<|im_end|> and <|endoftext|>) reaches the engine as stop_token_ids, as in evaluation. The stop strings
    are the request's, never the config's."""
    from rlinf_ext.protocol.generation import SamplingParams
    from rlinf_ext.workers.rollout_sglang import request_params

    defaults = SamplingParams(max_new_tokens=500, temperature=0.6, top_p=0.95, stop=["</answer>"])
    sent, merged = request_params(defaults, {"max_new_tokens": 64, "stop": ["</search>"]}, eos_ids=[151645, 151643])
    assert sent["temperature"] == 0.6 and sent["top_p"] == 0.95 and sent["max_new_tokens"] == 64
    assert sent["stop"] == ["</search>"] and sent["stop_token_ids"] == [151643, 151645]
    assert merged.stop == ["</search>"]
    unstopped, merged = request_params(defaults, {"max_new_tokens": 64}, eos_ids=[7])
    assert "stop" not in unstopped and merged.stop == []
    assert merged.include_stop_str_in_output is True
    hot, _ = request_params(defaults, {"temperature": 1.2}, eos_ids=[7])
    assert hot["temperature"] == 1.2
    greedy, _ = request_params(defaults, {"do_sample": False}, eos_ids=[7])
    assert greedy["temperature"] == 0.0 and "top_p" not in greedy
    with pytest.raises(ValueError, match="unknown sampling params"):
        request_params(defaults, {"temprature": 1.0}, eos_ids=[7])
