"""One RLinf channel, one named queue per stage."""

from __future__ import annotations

from rlinf_ext.protocol import channels, metric_keys


class RecordingChannel:
    def __init__(self):
        self.calls = []

    def put(self, item, weight=0, key=None, async_op=False):
        self.calls.append(("put", item, key))

    def get(self, key=None, async_op=False):
        self.calls.append(("get", None, key))


def test_keyed_channel_addresses_its_own_queue_and_sub_keys():
    raw = RecordingChannel()
    rollout = channels.KeyedChannel(raw, channels.ROLLOUT)
    rollout.put("r1")
    rollout.get()
    channels.KeyedChannel(raw, channels.GENERATE_OUTPUT).get(key="abc")
    assert raw.calls == [("put", "r1", "Rollout"), ("get", None, "Rollout"), ("get", None, "GenerateOutput/abc")]


def test_step_channels_are_rlinfs_names_once_each():
    assert channels.STEP_CHANNELS == ("DataLoader", "GenerateInput", "GenerateOutput", "Rollout", "Reward", "Inference")
    assert len(set(channels.STEP_CHANNELS)) == len(channels.STEP_CHANNELS)


def test_metric_key_helpers_build_the_logged_names():
    assert metric_keys.agent_metric("searches") == metric_keys.AGENT_SEARCHES
    assert metric_keys.validation_metric("all", "em") == metric_keys.VAL_ALL_EM
    assert metric_keys.prefixed(metric_keys.ACTOR_PREFIX, "loss") == metric_keys.ACTOR_LOSS
