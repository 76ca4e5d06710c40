"""FVQA parquet round trip, golds, canonicalisation at read time, and `rlinf-ext preprocess` on FVQA files."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from rlinf_ext.data.fvqa import (
    FVQAError,
    FVQARow,
    question_from_prompt,
    read_fvqa,
    write_fvqa,
)
from rlinf_ext.protocol.images import canonicalize


def _jpeg(size=(90, 60), colour=(10, 200, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="JPEG")
    return out.getvalue()


def _official_like(path, rows):
    """A parquet laid out as the released FVQA files (candidate_answers a JSON string, image_urls null)."""
    pq.write_table(pa.Table.from_pylist(rows), path)


def _raw(data_id, question="What is this?", gt="Drelia", cands='["City of Drelia"]', category="search_required"):
    return {
        "data_source": "fvqa_test",
        "prompt": [{"content": f"<image>{question}", "role": "user"}],
        "images": [{"bytes": _jpeg(), "path": None}],
        "data_id": data_id,
        "category": category,
        "reward_model": {"ground_truth": gt, "candidate_answers": cands, "style": "rule"},
        "image_urls": None,
    }


def test_read_canonicalises_and_golds_are_truth_then_candidates(tmp_path):
    path = tmp_path / "fvqa.parquet"
    _official_like(path, [_raw("fvqa_test_1"), _raw("fvqa_test_2", gt="Kroun", cands=None, category="search_free")])
    rows = read_fvqa(path, min_pixels=3136, max_pixels=12544)
    assert [r.data_id for r in rows] == ["fvqa_test_1", "fvqa_test_2"]
    assert rows[0].question == "What is this?" and rows[0].golds == ["Drelia", "City of Drelia"]
    assert rows[1].golds == ["Kroun"] and rows[1].category == "search_free"
    img = rows[0].images[0]
    assert img.width % 28 == 0 and img.height % 28 == 0 and img.to_pil().mode == "RGB"


def test_write_read_round_trip_keeps_bytes(tmp_path):
    ref = canonicalize(Image.new("RGB", (56, 56), (1, 2, 3)), 3136, 3136)
    row = FVQARow("id-1", "Which city?", [ref], "Drelia", ["Drelia city"], "search_required", "tiny")
    write_fvqa([row], tmp_path / "a.parquet")
    back = read_fvqa(tmp_path / "a.parquet", 3136, 3136)
    assert back == [row]
    raw = pq.read_table(tmp_path / "a.parquet").to_pylist()[0]
    assert json.loads(raw["reward_model"]["candidate_answers"]) == ["Drelia city"]
    assert raw["prompt"][0]["role"] == "user" and raw["image_urls"] is None


def test_errors_name_the_problem(tmp_path):
    path = tmp_path / "dup.parquet"
    _official_like(path, [_raw("same"), _raw("same")])
    with pytest.raises(FVQAError, match="appears in rows 0 and 1"):
        read_fvqa(path, 3136, 12544)
    bad = _raw("x")
    bad["images"] = [{"bytes": b"garbage", "path": None}]
    _official_like(tmp_path / "bad.parquet", [bad])
    with pytest.raises(FVQAError, match="cannot decode"):
        read_fvqa(tmp_path / "bad.parquet", 3136, 12544)
    pq.write_table(pa.Table.from_pylist([{"question": "q"}]), tmp_path / "text.parquet")
    with pytest.raises(FVQAError, match="not an FVQA parquet"):
        read_fvqa(tmp_path / "text.parquet", 3136, 12544)
    with pytest.raises(FVQAError, match="no user message"):
        question_from_prompt([{"role": "system", "content": "x"}])


@pytest.mark.slow
def test_preprocess_cli_on_fvqa(tmp_path):
    src = tmp_path / "in.parquet"
    _official_like(src, [_raw("a"), _raw("b", category="search_free")])
    out = tmp_path / "out.parquet"
    cmd = [
        sys.executable,
        "-m",
        "rlinf_ext.cli",
        "preprocess",
        "--input",
        str(src),
        "--output",
        str(out),
        "--image-min-pixels",
        "3136",
        "--image-max-pixels",
        "12544",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "wrote 2" in proc.stdout and "search_free: 1" in proc.stdout
    rows = read_fvqa(out, 3136, 12544)
    assert [r.data_id for r in rows] == ["a", "b"]
    # canonical already: a second pass keeps every image byte for byte
    assert [r.images[0].sha1 for r in rows] == [r.images[0].sha1 for r in read_fvqa(out, 3136, 12544)]
    proc = subprocess.run(cmd[:-4] + ["--image-min-pixels", "10"], capture_output=True, text=True)
    assert proc.returncode == 1 and "min_pixels" in proc.stderr
