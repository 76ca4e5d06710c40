"""Every schema key is read by some module outside ``rlinf_ext/config/``, or is one of the few read through a
mechanism the scan cannot see (``ALLOWED``, each with where it is read); RLinf's keys that rlinf_ext does not
implement are not in the schema at all but in ``config/compat.py``."""

from __future__ import annotations

from dataclasses import dataclass

from keys_read import modules, readers, unread_leaves

from rlinf_ext.config.compat import COMPAT
from rlinf_ext.config.reference import SCHEMA, leaves
from rlinf_ext.config.schema import fld

ALLOWED = {
    "cluster.node_groups": "RLinf's Cluster reads it: runner/services.py:140 Cluster(cluster_cfg=to_dictconfig(cfg)"
    ".cluster) -> rlinf/scheduler/cluster/config.py ClusterConfig.from_dict_cfg, node.py:320",
    "cluster.gpu_memory_gib": "the memory plan of validate and `rlinf-ext plan`: config/memory_plan.py:capacity",
    "runner.task_type": "chooses training or evaluation checks and plan: config/rule_registry.py:is_training, "
    "config/commands.py:53,104, config/memory_plan.py:342",
}


def test_every_schema_key_is_read_outside_config():
    scanned = modules()
    unread = unread_leaves(SCHEMA, ALLOWED, scanned)
    assert not unread, (
        f"schema keys no module outside rlinf_ext/config/ reads: {unread}. Read them where they take effect, "
        "move an RLinf key rlinf_ext does not implement to config/compat.py, or delete them."
    )
    # the allowed ones are really unread by the scan (else the entry is stale)
    assert set(unread_leaves(SCHEMA, (), scanned)) == set(ALLOWED)


def test_compat_keys_are_not_read_outside_config():
    scanned = modules()
    for entry in COMPAT:
        parent, name = entry.key.split(".")[-2:]
        hits = [p for p, r in scanned.items() if (parent, name) in r.chains or entry.key in r.strings]
        assert not hits, f"{entry.key} is in the compatibility table but read in {hits}: move it to the schema."


@dataclass
class _Probe:
    never_read_by_any_module: int = fld(0, "A key nothing reads.")
    max_epochs: int = fld(1, "Read by runner/trainer.py as cfg.runner.max_epochs, but not under unmounted.")


def test_the_scan_finds_an_unread_key_and_takes_extra_sections():
    scanned = modules()
    assert unread_leaves([("unmounted", _Probe)], (), scanned) == [
        "unmounted.never_read_by_any_module",
        "unmounted.max_epochs",
    ]
    assert unread_leaves([("runner", _Probe)], (), scanned) == ["runner.never_read_by_any_module"]
    (max_steps,) = [leaf for leaf in leaves(SCHEMA) if leaf.key == "runner.max_steps"]
    assert any(p.name == "trainer.py" for p in readers(max_steps, scanned))
