"""download.py against a local directory laid out like the hub (hub API faked at its boundary), and the
shell wrappers run from another directory."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "searchr1"


def _load_download_module():
    spec = importlib.util.spec_from_file_location("searchr1_download", EXAMPLES / "download.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through sys.modules
    spec.loader.exec_module(module)
    return module


class FakeHub:
    """``root/<repo_type>/<owner>/<repo>/<file>`` served through fakes of HfApi.list_repo_tree and hf_hub_download,
    each call bound to the installed library's signature. Files above 1 KB are listed as LFS files (sha256), the
    others with their git blob id, as the hub does. ``corrupt`` maps a file name to how many of its next downloads
    arrive damaged."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.calls: list[str] = []
        self.corrupt: dict[str, int] = {}

    def add(self, repo_id: str, files: dict[str, bytes], repo_type: str = "dataset") -> None:
        for name, data in files.items():
            path = self.root / repo_type / repo_id / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)

    def list_repo_tree(self, api, repo_id, *args, **kw):
        import huggingface_hub
        from huggingface_hub.hf_api import RepoFile

        inspect.signature(huggingface_hub.HfApi.list_repo_tree).bind(api, repo_id, *args, **kw)
        root = self.root / (kw.get("repo_type") or "model") / repo_id
        if not root.exists():
            raise huggingface_hub.errors.RepositoryNotFoundError(f"{repo_id} not found")
        for p in sorted(root.rglob("*")):
            if p.is_file():
                data = p.read_bytes()
                blob = hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()
                lfs = (
                    {"size": len(data), "oid": hashlib.sha256(data).hexdigest(), "pointerSize": 130}
                    if len(data) > 1000
                    else None
                )
                yield RepoFile(path=str(p.relative_to(root)), size=len(data), oid=blob, lfs=lfs)

    def hf_hub_download(self, *args, **kw):
        bound = inspect.signature(self.real_download).bind(*args, **kw).arguments
        repo_id, filename, local_dir = bound["repo_id"], bound["filename"], bound["local_dir"]
        self.calls.append(filename)
        target = Path(local_dir) / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        data = (self.root / (bound.get("repo_type") or "model") / repo_id / filename).read_bytes()
        if self.corrupt.get(filename, 0) > 0:
            self.corrupt[filename] -= 1
            data = bytes([data[0] ^ 0xFF]) + data[1:]  # same size, other bytes
        target.write_bytes(data)
        return str(target)


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    import huggingface_hub

    hub = FakeHub(tmp_path / "hub")
    hub.real_download = huggingface_hub.hf_hub_download
    monkeypatch.setattr(
        huggingface_hub.HfApi, "list_repo_tree", lambda api, *a, **kw: hub.list_repo_tree(api, *a, **kw)
    )
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hub.hf_hub_download)
    return hub


def _searchr1_repos(hub: FakeHub, index: bytes, corpus_gz: bytes, encoder: dict[str, bytes]) -> None:
    """Search-R1's repos as published: the index in two parts, the gzip corpus, the encoder (with the onnx copy
    download.py skips), and the data parquets."""
    half = len(index) // 2
    hub.add("PeterJinGo/wiki-18-e5-index", {"part_aa": index[:half], "part_ab": index[half:], "README.md": b"card"})
    hub.add("PeterJinGo/wiki-18-corpus", {"wiki-18.jsonl.gz": corpus_gz})
    hub.add(
        "intfloat/e5-base-v2",
        {**encoder, "onnx/model.onnx": os.urandom(3000), "pytorch_model.bin": b"pt" * 900},
        repo_type="model",
    )
    hub.add("PeterJinGo/nq_hotpotqa_train", {"train.parquet": b"PAR1train" * 200, "test.parquet": b"PAR1test"})


def _random_searchr1(hub: FakeHub) -> dict:
    index, corpus = os.urandom(300_000), b'{"id": "0", "contents": "\\"A\\"\\ntext"}\n' * 1000
    encoder = {"config.json": b'{"hidden_size": 32}', "vocab.txt": b"[PAD]\n", "model.safetensors": os.urandom(5000)}
    _searchr1_repos(hub, index, gzip.compress(corpus), encoder)
    return {"index": index, "corpus": corpus, "encoder": encoder}


def test_download_lays_files_out_where_the_next_steps_read_them(fake_hub, tmp_path, capsys):
    dl = _load_download_module()
    published = _random_searchr1(fake_hub)
    save = tmp_path / "work"
    outputs = dl.download(save)  # default for searchr1: index, corpus, encoder, data
    assert (save / "e5_Flat.index").read_bytes() == published["index"]
    assert (save / "wiki-18.jsonl").read_bytes() == published["corpus"] and (save / "wiki-18.jsonl.gz").is_file()
    encoder = save / "models" / "e5-base-v2"
    assert sorted(p.name for p in encoder.iterdir() if p.is_file()) == sorted(published["encoder"])  # no onnx, .bin
    assert sorted(p.name for p in (save / "data" / "nq_hotpotqa_train").glob("*.parquet")) == [
        "test.parquet",
        "train.parquet",
    ]
    assert not (save / "parts").exists()  # removed after a verified concatenation
    assert set(outputs) == {
        save / "e5_Flat.index",
        save / "wiki-18.jsonl",
        encoder,
        save / "data/nq_hotpotqa_train/test.parquet",
        save / "data/nq_hotpotqa_train/train.parquet",
    }
    out = capsys.readouterr().out
    plan = out[out.index("download plan") : out.index("downloading")]  # printed before anything starts
    assert re.search(
        rf"index +PeterJinGo/wiki-18-e5-index \(2 files\) +300.0 KB +~ *0 s +-> {save}/e5_Flat.index", plan
    )
    assert f"-> {encoder}" in plan and "to download, then" in plan and "disk needed" in plan
    assert "checking part_aa (sha256)" in out and "checking config.json (git blob id)" in out
    # a second run downloads and hashes nothing: every file is recorded as verified
    fake_hub.calls.clear()
    dl.download(save)
    assert fake_hub.calls == [] and "checking" not in capsys.readouterr().out


def test_download_fetches_a_damaged_file_again_then_refuses(fake_hub, tmp_path, capsys):
    dl = _load_download_module()
    published = _random_searchr1(fake_hub)
    save = tmp_path / "work"
    fake_hub.corrupt["part_ab"] = 1  # the first transfer arrives damaged: fetched once more
    dl.download(save, what=["index"])
    assert (save / "e5_Flat.index").read_bytes() == published["index"]
    assert fake_hub.calls.count("part_ab") == 2 and "its sha256 differs from the hub's" in capsys.readouterr().out
    fake_hub.corrupt["config.json"] = 2  # damaged twice: refused, naming the file and the fix
    with pytest.raises(dl.DownloadError, match=r"config.json its git blob id differs .* after downloading it twice"):
        dl.download(save, what=["encoder"])
    (save / "wiki-18.jsonl.gz").write_bytes(b"truncated")  # a partial file of the wrong size is fetched again
    dl.download(save, what=["corpus"])
    assert (save / "wiki-18.jsonl").read_bytes() == published["corpus"]
    with pytest.raises(dl.DownloadError, match="pages exist only for --source asearcher"):
        dl.download(save, "searchr1", ["pages"])
    # asearcher's repos are not in the fake hub: the listing fails like an unreachable hub.
    assert dl.main(["--save_path", str(save), "--source", "asearcher", "--what", "corpus"]) == 1


def test_an_interrupted_concatenation_resumes(fake_hub, tmp_path, monkeypatch):
    dl = _load_download_module()
    published = _random_searchr1(fake_hub)
    save = tmp_path / "work"
    real_copy = shutil.copyfileobj

    def interrupted(src, dst, length=0):  # the second part never arrives: like a kill during `cat`
        if Path(src.name).name == "part_ab":
            raise KeyboardInterrupt
        real_copy(src, dst, length)

    monkeypatch.setattr(dl.shutil, "copyfileobj", interrupted)
    with pytest.raises(KeyboardInterrupt):
        dl.download(save, what=["index"])
    partial = save / "e5_Flat.index.partial"
    assert partial.stat().st_size == len(published["index"]) // 2
    monkeypatch.setattr(dl.shutil, "copyfileobj", real_copy)
    fake_hub.calls.clear()
    dl.download(save, what=["index"])
    assert fake_hub.calls == []  # the parts were verified before: not fetched again
    assert (save / "e5_Flat.index").read_bytes() == published["index"] and not partial.exists()


@pytest.mark.timeout(300)
def test_the_published_files_downloaded_are_adopted_by_the_next_command(
    fake_hub, published_retrieval, tmp_path, capsys
):
    """The hub serves the published fixtures; download.py, then the `next:` command of its --help, runs as is."""
    dl = _load_download_module()
    encoder = {p.name: p.read_bytes() for p in published_retrieval.encoder.iterdir() if p.is_file()}
    _searchr1_repos(
        fake_hub, published_retrieval.flat_index.read_bytes(), published_retrieval.corpus_gz.read_bytes(), encoder
    )
    work = tmp_path / "work"
    assert dl.main(["--save_path", str(work), "--what", "index,corpus,encoder"]) == 0
    command = dl.LAYOUT[dl.LAYOUT.index("next: ") + len("next: ") :].replace("\\\n", " ").replace("$WORK", str(work))
    argv = command.split()
    assert argv[0] == "rlinf-ext"
    from rlinf_ext.cli import main as cli

    assert cli(argv[1:] + ["--device", "cpu", "--threads", "1"]) == 0
    assert "16/16 sampled passages re-encoded at rank 1" in capsys.readouterr().out
    assert (work / "index" / "e5_flat" / "index_meta.json").is_file()


def test_download_fvqa_data_and_cache(fake_hub, tmp_path, capsys):
    dl = _load_download_module()
    fvqa = {
        "fvqa_train.parquet": b"PAR1train",
        "fvqa_test.parquet": b"PAR1test",
        "fvqa_train_image_search_results_cache.pkl": os.urandom(5000),
        "fvqa_test_image_search_results_cache.pkl": os.urandom(3000),
        "README.md": b"card",
    }
    fake_hub.add("lmms-lab/FVQA", fvqa)
    save = tmp_path / "fvqa"
    assert dl.main(["--save_path", str(save), "--source", "fvqa"]) == 0  # default: data,cache
    names = sorted(p.name for p in save.iterdir() if p.is_file() and not p.name.startswith("."))
    assert names == sorted(n for n in fvqa if n != "README.md")
    assert all((save / n).read_bytes() == fvqa[n] for n in names)
    fake_hub.calls.clear()
    dl.download(save, "fvqa", ["data"])
    assert fake_hub.calls == []  # verified files are not fetched again
    with pytest.raises(dl.DownloadError, match="has no index"):
        dl.download(save, "fvqa", ["index"])
    # FVQA_Cache is not in the fake hub: a clear error, as for an unreachable hub
    assert dl.main(["--save_path", str(save), "--source", "fvqa", "--what", "cache_dir"]) == 1
    assert "cannot reach the Hugging Face hub" in capsys.readouterr().err


def test_download_offline_gives_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub

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
    subprocess.run(
        ["bash", str(EXAMPLES / "build_index.sh"), str(retrieval_assets.corpus), str(index)],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
    )
    assert (index / "index_meta.json").exists()
    addr = tmp_path / "addr"
    proc = subprocess.Popen(
        ["bash", str(EXAMPLES / "launch_local_server.sh"), "--port", "0", "--save-address-to", str(addr)],
        cwd="/",
        env={**env, "INDEX_DIR": str(index), "CORPUS": str(retrieval_assets.corpus)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
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
