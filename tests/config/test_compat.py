"""RLinf's compatibility table: each key is accepted (and dropped) at its one value and refused at any other."""

from __future__ import annotations

import dataclasses

import pytest

from rlinf_ext.config import check_config, load_config, to_dictconfig
from rlinf_ext.config.compat import COMPAT, Follows, accepted_value
from rlinf_ext.config.schema import ExperimentConfig

pytestmark = pytest.mark.usefixtures("sglang_profile_installed")

REFUSED = 12345  # no compatibility key accepts it


def _schema_keys(cls=ExperimentConfig, prefix=""):
    for f in dataclasses.fields(cls):
        sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if isinstance(sub, type) and dataclasses.is_dataclass(sub):
            yield from _schema_keys(sub, f"{prefix}{f.name}.")
        else:
            yield prefix + f.name


def _yaml(value):
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def test_compat_keys_are_not_in_the_schema_and_listed_once():
    keys = [entry.key for entry in COMPAT]
    assert len(keys) == len(set(keys))
    assert not set(keys) & set(_schema_keys())
    assert all(entry.why.strip() and entry.fix_text().strip() for entry in COMPAT)


@pytest.mark.parametrize("name", ["tiny-cpu", "tiny-cpu-eval", "tiny-mm-cpu"])
def test_every_compat_key_at_another_value_is_refused_with_its_reason(name):
    result = check_config(name, [f"{entry.key}={REFUSED}" for entry in COMPAT])
    by_key = {issue.key: issue for issue in result.issues}
    for entry in COMPAT:
        issue = by_key[entry.key]
        assert f"{entry.key}={REFUSED} is an RLinf setting that rlinf_ext does not implement" in issue.reason
        assert entry.why in issue.reason and issue.fix == entry.fix_text()
    assert len(result.issues) == len(COMPAT), [str(i) for i in result.issues]


@pytest.mark.parametrize("name", ["tiny-cpu", "tiny-cpu-eval", "tiny-mm-cpu"])
def test_every_compat_key_at_its_accepted_value_loads_and_is_dropped(name):
    plain = load_config(name)
    rlinf = to_dictconfig(plain)
    values = {entry.key: accepted_value(entry, lambda dotted: _select(rlinf, dotted)) for entry in COMPAT}
    cfg = load_config(name, [f"{key}={_yaml(value)}" for key, value in values.items()])
    assert cfg == plain  # dropped: the typed config is the same
    for key, value in values.items():
        assert _select(to_dictconfig(cfg), key) == value  # RLinf's Cluster and placement see them


def _select(tree, dotted):
    for part in dotted.split("."):
        tree = tree[part]
    return tree


def test_accepted_values_that_follow_other_keys():
    by_key = {
        issue.key: issue
        for issue in check_config(
            "tiny-cpu", ["actor.megatron.distributed_backend=nccl", "rollout.is_eval=true"]
        ).issues
    }
    assert "gloo on a CPU cluster" in by_key["actor.megatron.distributed_backend"].fix
    assert "runner.task_type=reasoning_eval" in by_key["rollout.is_eval"].fix
    assert check_config("tiny-cpu", ["actor.megatron.distributed_backend=gloo", "rollout.is_eval=false"]).ok
    assert check_config("tiny-cpu-eval", ["rollout.is_eval=true"]).ok
    # an interpolation is compared by its resolved value
    assert check_config("tiny-cpu", ["actor.tokenizer.tokenizer_model=${rollout.model.model_path}"]).ok
    assert not check_config("tiny-cpu", ["actor.tokenizer.tokenizer_model=/elsewhere"]).ok
    assert isinstance(next(e for e in COMPAT if e.key == "rollout.is_eval").accepted, Follows)


def test_a_compat_section_holds_only_compat_keys():
    by_key = {
        issue.key: issue
        for issue in check_config(
            "tiny-cpu", ["actor.tokenizer.use_fast=false", "actor.tokenizer.use_fsat=true"]
        ).issues
    }
    assert "transformers' default" in by_key["actor.tokenizer.use_fast"].reason
    assert "did you mean actor.tokenizer.use_fast" in by_key["actor.tokenizer.use_fsat"].fix
    assert check_config("tiny-cpu", ["actor.tokenizer.use_fast=true"]).ok
    # booleans are not numbers: 1 is not the accepted true
    assert not check_config("tiny-cpu", ["actor.tokenizer.use_fast=1"]).ok
