"""download.py against a local directory laid out like the hub (hub API faked at its boundary), and the
shell wrappers run from another directory."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from signature_checks import checked_against

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "searchr1"


def _load_download_module():
    spec = importlib.util.spec_from_file_location("searchr1_download", EXAMPLES / "download.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """``hub/<owner>/<repo>/<file>`` served through fakes of HfApi.list_repo_tree and hf_hub_download."""
    import huggingface_hub
    from huggingface_hub.hf_api import RepoFile

    hub = tmp_path / "hub"
    index_bytes = os.urandom(300_000)
    (hub / "PeterJinGo/wiki-18-e5-index").mkdir(parents=True)
    (hub / "PeterJinGo/wiki-18-e5-index/part_aa").write_bytes(index_bytes[:200_000])
    (hub / "PeterJinGo/wiki-18-e5-index/part_ab").write_bytes(index_bytes[200_000:])
    (hub / "PeterJinGo/wiki-18-e5-index/README.md").write_text("readme")
    corpus = b'{"id": "0", "contents": "\\"A\\"\\ntext"}\n' * 1000
    (hub / "PeterJinGo/wiki-18-corpus").mkdir(parents=True)
    with gzip.open(hub / "PeterJinGo/wiki-18-corpus/wiki-18.jsonl.gz", "wb") as f:
        f.write(corpus)
    fvqa = hub / "lmms-lab/FVQA"
    fvqa.mkdir(parents=True)
    fvqa_files = {"fvqa_train.parquet": b"PAR1train", "fvqa_test.parquet": b"PAR1test",
                  "fvqa_train_image_search_results_cache.pkl": os.urandom(5000),
                  "fvqa_test_image_search_results_cache.pkl": os.urandom(3000), "README.md": b"card"}
    for name, data in fvqa_files.items():
        (fvqa / name).write_bytes(data)
    calls = []

    @checked_against(huggingface_hub.HfApi.list_repo_tree)  # the hub's own signatures: a call it refuses fails here
    def list_repo_tree(self, repo_id, repo_type=None, recursive=False, **kw):
        assert repo_type == "dataset"
        root = hub / repo_id
        if not root.exists():
            raise huggingface_hub.errors.RepositoryNotFoundError(f"{repo_id} not found")
        for p in sorted(root.rglob("*")):
            if p.is_file():
                data = p.read_bytes()
                yield RepoFile(path=str(p.relative_to(root)), size=len(data), oid="x",
                               lfs={"size": len(data), "oid": hashlib.sha256(data).hexdigest(), "pointerSize": 1})

    @checked_against(huggingface_hub.hf_hub_download)
    def hf_hub_download(repo_id, filename, repo_type=None, local_dir=None, **kw):
        calls.append(filename)
        target = Path(local_dir) / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(hub / repo_id / filename, target)
        return str(target)

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_tree", list_repo_tree)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    return {"index": index_bytes, "corpus": corpus, "calls": calls, "fvqa": fvqa_files}


def test_download_concatenates_parts_decompresses_and_resumes(fake_hub, tmp_path, capsys):
    dl = _load_download_module()
    save = tmp_path / "save"
    outputs = dl.download(save, "searchr1", ["index", "corpus"], verify_sha256=True)
    assert (save / "e5_Flat.index").read_bytes() == fake_hub["index"]
    assert (save / "wiki-18.jsonl").read_bytes() == fake_hub["corpus"]
    assert set(outputs) == {save / "e5_Flat.index", save / "wiki-18.jsonl"}
    assert not (save / "part_aa").exists()  # parts removed after a verified concatenation
    out = capsys.readouterr().out
    assert out.index("disk space needed") < out.index("downloading")
    assert sorted(fake_hub["calls"]) == ["part_aa", "part_ab", "wiki-18.jsonl.gz"]
    # A second run downloads nothing: everything is recognised as complete.
    fake_hub["calls"].clear()
    dl.download(save, "searchr1", ["index", "corpus"])
    assert fake_hub["calls"] == []


def test_download_detects_wrong_size_and_bad_choices(fake_hub, tmp_path):
    dl = _load_download_module()
    save = tmp_path / "save"
    save.mkdir()
    (save / "wiki-18.jsonl.gz").write_bytes(b"truncated")  # a partial file of the wrong size is fetched again
    dl.download(save, "searchr1", ["corpus"])
    assert (save / "wiki-18.jsonl").read_bytes() == fake_hub["corpus"]
    with pytest.raises(dl.DownloadError, match="pages exist only for --source asearcher"):
        dl.download(save, "searchr1", ["pages"])
    # asearcher's repos are not in the fake hub: the listing fails like an unreachable hub.
    assert dl.main(["--save_path", str(save), "--source", "asearcher", "--what", "corpus"]) == 1


def test_download_fvqa_data_and_cache(fake_hub, tmp_path, capsys):
    dl = _load_download_module()
    save = tmp_path / "fvqa"
    assert dl.main(["--save_path", str(save), "--source", "fvqa", "--verify-sha256"]) == 0  # default: data,cache
    names = sorted(p.name for p in save.iterdir())
    assert names == sorted(n for n in fake_hub["fvqa"] if n != "README.md")
    assert all((save / n).read_bytes() == fake_hub["fvqa"][n] for n in names)
    fake_hub["calls"].clear()
    dl.download(save, "fvqa", ["data"])
    assert fake_hub["calls"] == []  # complete files are not fetched again
    with pytest.raises(dl.DownloadError, match="has no index"):
        dl.download(save, "fvqa", ["index"])
    # FVQA_Cache is not in the fake hub: a clear error, as for an unreachable hub
    assert dl.main(["--save_path", str(save), "--source", "fvqa", "--what", "cache_dir"]) == 1
    assert "cannot reach the Hugging Face hub" in capsys.readouterr().err


def test_download_offline_gives_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub

    @checked_against(huggingface_hub.HfApi.list_repo_tree)
    def offline(*a, **kw):
        raise huggingface_hub.errors.OfflineModeIsEnabled("offline mode is enabled")

    monkeypatch.setattr(huggingface_hub.HfApi, "list_repo_tree", offline)
    dl = _load_download_module()
    assert dl.main(["--save_path", str(tmp_path), "--what", "index"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach the Hugging Face hub" in err and "HF_ENDPOINT" in err


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_shell_wrappers_work_from_any_directory_and_honour_port(retrieval_assets, tmp_path):
    env = {**os.environ, "PYTHON": sys.executable}
    index = tmp_path / "idx"
    subprocess.run(["bash", str(EXAMPLES / "build_index.sh"), str(retrieval_assets.corpus), str(index)],
                   cwd=tmp_path, env=env, check=True, capture_output=True)
    assert (index / "index_meta.json").exists()
    addr = tmp_path / "addr"
    proc = subprocess.Popen(
        ["bash", str(EXAMPLES / "launch_local_server.sh"), "--port", "0", "--save-address-to", str(addr)],
        cwd="/", env={**env, "INDEX_DIR": str(index), "CORPUS": str(retrieval_assets.corpus)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while not list(addr.glob("Host*_IP*.txt")) and time.time() < deadline and proc.poll() is None:
            time.sleep(0.1)
        files = list(addr.glob("Host*_IP*.txt"))
        assert files, proc.stdout.read().decode() if proc.poll() is not None else "no address file"
        host_port = files[0].read_text()
        assert host_port.startswith("127.0.0.1:") and host_port != "127.0.0.1:8000"
        r = httpx.post(f"http://{host_port}/retrieve", json={"queries": ["city"], "topk": 2})
        assert r.status_code == 200 and len(r.json()["result"][0]) == 2
    finally:
        proc.terminate()
        proc.wait(30)
    assert not list(addr.glob("Host*_IP*.txt"))
