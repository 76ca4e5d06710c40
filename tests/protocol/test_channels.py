"""One RLinf channel, one named queue per stage."""

from __future__ import annotations

from rlinf.scheduler import Channel

from rlinf_ext.protocol import channels, metric_keys
from tests.support.signature_checks import checked_against


class RecordingChannel:
    """RLinf's ``Channel`` (put/get spelled and checked as RLinf 0.3.0's), recording the sub-queue keys."""

    def __init__(self):
        self.calls = []

    @checked_against(Channel.put)
    def put(self, item, weight=0, key="default_queue", async_op=False):
        self.calls.append(("put", item, key))

    @checked_against(Channel.get)
    def get(self, key="default_queue", async_op=False):
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
