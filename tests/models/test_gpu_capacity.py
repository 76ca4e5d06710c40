"""``models/gpu_capacity.py``: what a GPU gives CUDA, from this node's GPU of the configured kind or the table."""

from __future__ import annotations

import pytest
import torch

from rlinf_ext.models.gpu_capacity import GIB, gpu_capacity, local_gpu_total_bytes


@pytest.mark.parametrize(
    "nominal, usable, kind",
    [
        (40, 39.25, "A100 40GB"),
        (80, 79.14, "A100 / H100 80GB"),
        (141, 139.72, "H200 141GB"),
        (180, 178.35, "B200 180GB"),
    ],
)
def test_listed_kinds_give_the_tables_figure(nominal, usable, kind):
    c = gpu_capacity(nominal)
    assert c.usable_bytes == int(usable * GIB) and c.source == f"{kind}: the table's figure"


def test_an_unlisted_size_gives_98_percent_of_it():
    for nominal in (30, 79.5):
        c = gpu_capacity(nominal)
        assert c.usable_bytes == int(0.98 * nominal * GIB) and "98% of the nominal size" in c.source


def test_this_nodes_gpu_is_read_when_it_is_of_the_configured_kind():
    h100 = int(79.2 * GIB)
    assert gpu_capacity(80, h100).usable_bytes == h100 and gpu_capacity(80, h100).source == "read from this node's GPU"
    # an 80 GiB config validated on an H200 node, or a reading over the nominal size: the table stands
    for other in (int(139.8 * GIB), int(80.5 * GIB), int(70 * GIB)):
        assert gpu_capacity(80, other).usable_bytes == int(79.14 * GIB)


@pytest.mark.timeout(180)
def test_the_local_reading_comes_from_a_child_process():
    local_gpu_total_bytes.cache_clear()
    got = local_gpu_total_bytes()
    if torch.cuda.device_count() == 0:
        assert got is None
        return
    assert not torch.cuda.is_initialized()  # no CUDA context left in this process
    assert got == torch.cuda.mem_get_info(0)[1]
