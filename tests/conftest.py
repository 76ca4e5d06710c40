"""Shared fixtures. The tiny assets are copied per session from the tiny-asset cache (built offline, by the repo's own code)."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

# One intra-op thread per test process unless the caller set OMP_NUM_THREADS: two xdist workers share the CI's 2
# cores, and a thread per core in every process (pytest's, a spawned rank, a launcher, a CLI) oversubscribes them
# (Ray gives its workers one already; the training and FSDP tests with -n 2: 90.8 s against 100.9 s). Set before
# torch loads, which reads it once: set later (torch.set_num_threads), an in-process vLLM CPU engine of a -n 0 run
# failed its attention check ("thread_num 2 vs. 1").
THREADS_ENV = "OMP_NUM_THREADS"
os.environ.setdefault(THREADS_ENV, "1")

import pytest  # noqa: E402
import torch  # noqa: E402


def _session_assets(tmp_path_factory, **parts):
    """The session's asset directory with ``parts`` added, copied from the tiny-asset cache (assets/core/cache.py;
    `rlinf-ext make-tiny-assets` fills it before the tests in CI, and a missing part is built here otherwise).
    A copy: tests and the launcher write beside the assets (an index), and the cache entry stays as built."""
    from rlinf_ext.assets.core.cache import copy_parts
    from rlinf_ext.assets.core.tiny import Parts

    return copy_parts(tmp_path_factory.getbasetemp() / "tiny_assets", Parts.of(**parts), seed=0)


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory):
    """The offline tiny assets (docs/contracts.md, "Data and tiny assets"): the base, no warm start."""
    return _session_assets(tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_assets_sft(tiny_assets, tmp_path_factory):
    """`tiny_assets` plus the text warm start's search phase, `models/qwen2-tiny-sft-search` (~5 min on 2 cores
    when the cache lacks it). The give-up phase (`qwen2-tiny-sft`, the tiny experiment's model) is used by no
    test, and not built for them."""
    return _session_assets(tmp_path_factory, sft_search=True)


@pytest.fixture(scope="session")
def tiny_assets_registry(tiny_assets, tmp_path_factory):
    """`tiny_assets` plus the registry world and its reader warm start (`registry/`, the tiny experiment's world;
    ~4 min on 2 cores when the cache lacks it)."""
    return _session_assets(tmp_path_factory, registry=True)


@pytest.fixture(scope="session")
def published_data(tiny_assets, tmp_path_factory):
    """Search-R1's train.parquet and merged test.parquet and RLinf's train.jsonl, in their published formats, made
    from the tiny assets' questions (``rlinf_ext/data/published_fixtures.py``)."""
    from rlinf_ext.data.published_fixtures import write_published_data

    return write_published_data(tiny_assets, tmp_path_factory.mktemp("published_data"))


@pytest.fixture(scope="session")
def retrieval_url(tiny_assets, tmp_path_factory):
    """``http://127.0.0.1:PORT`` of one real BM25 retrieval server over the tiny corpus, shared by the session
    (read-only: tests that stop or break a server start their own)."""
    from rlinf_ext.retrieval.build import build_index
    from rlinf_ext.retrieval.config import BuildConfig
    from rlinf_ext.retrieval.launch import RetrievalServerProcess

    index_dir = tmp_path_factory.mktemp("bm25")
    build_index(BuildConfig(corpus=str(tiny_assets.corpus_path), out=str(index_dir), retriever="bm25"))
    with RetrievalServerProcess(index_dir, tiny_assets.corpus_path, topk=3, startup_timeout_s=120) as url:
        yield url


def randomize_qwen2_(model, seed: int = 0):
    """Every weight of a HF Qwen2 model replaced in place by N(0, 0.1) (norms around 1): the generator's models
    have zero biases and unit norms, and a comparison must be sensitive to every tensor (a swapped bias or norm
    changes the output)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))
    return model


@pytest.fixture(scope="session")
def randomized_qwen2():
    """``randomized_qwen2(model_dir, seed=0)`` -> a fp32 HF ``Qwen2ForCausalLM`` with every weight randomised."""
    from transformers import Qwen2ForCausalLM

    def load(model_dir, seed: int = 0):
        model = Qwen2ForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        return randomize_qwen2_(model, seed)

    return load


@pytest.fixture(scope="session")
def actor_samples():
    """``actor_samples(vocab, n=4, seed=0)`` -> actor ``Sample``s: prompts of 3+i ids, responses of 5 or 8 ids with
    an observation (mask 0) at positions 2-3, rewards alternating 0/1 (so GRPO groups of 2 have advantages)."""
    from rlinf_ext.training.grpo_policy import Sample

    def make(vocab: int, n: int = 4, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        out = []
        for i in range(n):
            p = torch.randint(3, vocab, (3 + i,), generator=g).tolist()
            r = torch.randint(3, vocab, (5 + (i % 2) * 3,), generator=g).tolist()
            m = [1] * len(r)
            m[2:4] = [0, 0]  # an "observation" in the middle of the response
            out.append(Sample(p, r, m, reward=float(i % 2)))
        return out

    return make


@pytest.fixture
def sglang_profile_installed(monkeypatch):
    """Validation as on a node with the SGLang profile installed (protocol/engines.py `installed_version` reports
    sglang's pinned release): configs with rollout_backend=sglang validate on a CPU machine without sglang."""
    from rlinf_ext.protocol import engines

    monkeypatch.setattr(engines, "installed_version", lambda package: engines.SGLANG_VERSION)


@pytest.fixture(scope="session")
def sglang_source():
    """sglang 0.5.23's release for the SGLang tests (tests/support/sglang_source.py): its request types and signatures read
    from the installed source, its real ServerArgs built in a child process. Missing: the test fails with the fix
    (`bash scripts/install.sh --dev`); CI installs it."""
    from tests.support.sglang_source import SGLangSource, SGLangSourceMissing

    try:
        return SGLangSource.find()
    except SGLangSourceMissing as exc:
        missing = str(exc)
    pytest.fail(missing, pytrace=False)  # outside the except: the message once, no chained traceback


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("gpu")
    if marker is not None:
        needed = int(marker.args[0]) if marker.args else 1
        available = torch.cuda.device_count()
        if available < needed:
            pytest.skip(f"needs {needed} CUDA device(s), {available} visible")


@pytest.fixture(scope="session")
def tiny_mm_assets(tiny_assets, tmp_path_factory):
    """`tiny_assets` plus the multimodal world under mm/ (`make-tiny-assets --with-mm`, ~10 s on 2 cores)."""
    return _session_assets(tmp_path_factory, mm=True)


@pytest.fixture(scope="session")
def tiny_mm_assets_sft(tiny_mm_assets, tmp_path_factory):
    """`tiny_mm_assets` plus the warm-started `mm/models/qwen2.5-vl-tiny-sft` (~3.5 min on 2 cores when the cache
    lacks it)."""
    return _session_assets(tmp_path_factory, mm_sft=True)


# Session fixtures that train a warm start when the cache lacks it: their first user then pays the training
# inside its own timeout (pytest-timeout counts fixture setup), so every user's hang guard is widened by this
# budget (CI fills the cache before the tests, so there it is never spent).
WARM_START_BUDGET_S = {"tiny_assets_sft": 720, "tiny_assets_registry": 480, "tiny_mm_assets_sft": 600}


VLLM_MODEL_FIXTURES = ("qwen2_head32_dirs", "qwen2_5_vl_head32_dirs")  # the in-process vLLM tests' models

# Two workers (`-n 2`; pytest.ini: `--dist loadfile --no-loadscope-reorder`): a file's tests run in one worker
# process, in collection order (its module fixtures are built once), files handed out in the order
# `pytest_collection_modifyitems` leaves (xdist's own, by test count, says nothing about seconds). The in-process vLLM
# tests' files are one unit (the scheduler below): the first of the collection, so the worker that takes it runs them
# before anything loads numba. Then the longest files first (FILE_SECONDS): a 3-minute launcher file handed out last
# would leave the other worker idle for its length; short files last fill the gaps.
# pytest-xdist's own `loadgroup` cannot group on pytest 9.2: it tags node ids, which pytest 9.2's structured ids
# ignore (pytest-xdist issue 1386).
VLLM_IN_PROCESS_FILES = (
    "tests/generation/test_vllm_cpu_options.py",
    "tests/generation/test_vllm_engine.py",
    "tests/generation/test_vllm_tied_reload.py",
    "tests/workers/test_rollout_vllm.py",
    "tests/generation/vllm_vl_checks.py",
)  # the last: run in an interpreter of its own
VLLM_IN_PROCESS_UNIT = "vllm_in_process"
XDIST_DIST = "loadfile"


# seconds per test file (setup, call and teardown of its tests) under `-n 2`, written by `--write-file-durations`;
# a file it lacks sorts as 0 (after every listed file, in collection order)
FILE_SECONDS = Path(__file__).with_name("file_durations.json")
MIN_LISTED_S = 1.0  # the table keeps files at least this long: below, the order hardly matters


def pytest_addoption(parser):
    parser.addoption(
        "--write-file-durations",
        metavar="PATH",
        help=f"write tests/{FILE_SECONDS.name} to PATH with this run's seconds per test file merged in "
        f"(the order CI hands files out in); refresh it with `-n 2 --write-file-durations "
        f"tests/{FILE_SECONDS.name}` over the whole suite.",
    )


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


# directories whose files share a per-process resource: tests/runner/'s Ray instance (tests/runner/conftest.py, ~20
# CPU-s to start) goes down after the directory's last test, so its files are one unit of work (one worker, one
# instance), placed by their total
SHARED_PROCESS_DIRS = ("tests/runner/",)


def file_order_key(seconds: dict[str, float]):
    """The sort key of a test file's path: longest first by ``seconds``; a SHARED_PROCESS_DIRS directory as one
    block at its files' total, longest file first. Unlisted files sort as 0 (a stable sort keeps their collection
    order)."""

    group_seconds: dict[str, float] = {}
    for path, s in seconds.items():
        key = shared_dir(path) or path
        group_seconds[key] = s + group_seconds.get(key, 0.0)
    return lambda path: (-group_seconds.get(shared_dir(path) or path, 0.0), shared_dir(path), -seconds.get(path, 0.0))


def shared_dir(path: str) -> str:
    """The SHARED_PROCESS_DIRS directory of a test file, "" for a file on its own."""
    return next((d for d in SHARED_PROCESS_DIRS if path.startswith(d)), "")


def xdist_scope(nodeid: str) -> str:
    """The unit of work a test is handed out in: its file, its SHARED_PROCESS_DIRS directory, or
    VLLM_IN_PROCESS_UNIT."""
    path = _file_of(nodeid)
    return VLLM_IN_PROCESS_UNIT if path in VLLM_IN_PROCESS_FILES else shared_dir(path) or path


def pytest_configure(config):
    if getattr(config.option, "numprocesses", None) and config.option.dist != XDIST_DIST:
        raise pytest.UsageError(
            f"--dist {config.option.dist}: the tests are handed out for `--dist {XDIST_DIST}` "
            "(tests/conftest.py, VLLM_IN_PROCESS_FILES: the in-process vLLM tests must run first "
            "in their worker); drop --dist (pytest.ini sets it) or run with -n 0."
        )


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadFileScheduling

    class VllmFirstFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return VllmFirstFileScheduling(config, log)


def pytest_collection_modifyitems(items):
    # In-process vLLM engines first: vLLM 0.32's CPU platform scans every loaded module when an engine starts and
    # fails on llvmlite's lazy ffi object, which `import bm25s` (numba) loads; the tiny assets import bm25s.
    # The launcher's and the rollout worker's processes never import it (tests/workers/test_rollout_vllm.py checks).
    in_vllm = [item for item in items if set(VLLM_MODEL_FIXTURES) & set(getattr(item, "fixturenames", ()))]
    if stray := sorted({item.nodeid.split("::", 1)[0] for item in in_vllm} - set(VLLM_IN_PROCESS_FILES)):
        raise pytest.UsageError(
            f"in-process vLLM tests in {stray}: add the file to VLLM_IN_PROCESS_FILES in "
            "tests/conftest.py (under -n 2 its tests must run in the worker's vLLM unit)."
        )
    # a stable sort: a file's tests stay together and in order, unlisted files keep collection order; the vLLM
    # tests keep theirs
    by_file = file_order_key(json.loads(FILE_SECONDS.read_text()))

    def order(item):
        in_vllm = bool(set(VLLM_MODEL_FIXTURES) & set(getattr(item, "fixturenames", ())))
        return (not in_vllm, () if in_vllm else by_file(_file_of(item.nodeid)))

    items.sort(key=order)
    for item in items:
        extra = sum(s for name, s in WARM_START_BUDGET_S.items() if name in getattr(item, "fixturenames", ()))
        marker = item.get_closest_marker("timeout")
        if extra and marker is not None and marker.args:
            item.add_marker(pytest.mark.timeout(float(marker.args[0]) + extra), append=False)


_ran_seconds: Counter = Counter()


def pytest_runtest_logreport(report):
    _ran_seconds[_file_of(report.nodeid)] += report.duration


def pytest_sessionfinish(session):
    # under xdist the controller sees every worker's reports; a worker (it has workerinput) writes nothing
    out = session.config.getoption("write_file_durations")
    if not out or hasattr(session.config, "workerinput"):
        return
    table = {**json.loads(FILE_SECONDS.read_text()), **_ran_seconds}
    root = FILE_SECONDS.parent.parent
    kept = sorted(
        ((path, round(s, 1)) for path, s in table.items() if s >= MIN_LISTED_S and (root / path).exists()),
        key=lambda x: (-x[1], x[0]),
    )
    Path(out).write_text(json.dumps(dict(kept), indent=0) + "\n")


@pytest.fixture(scope="session")
def qwen2_head32_pair(tmp_path_factory):
    """Two tiny Qwen2 checkpoints of the contract's tiny shape (``TinyQwen2Shape()``: head size 32, which vLLM's CPU
    attention takes), every weight randomised (seeds 1 and 2), with a tokenizer of the tiny assets' kind trained on
    a few sentences. Built without the tiny assets, whose BM25 step loads numba (see
    ``pytest_collection_modifyitems``). Tests of other engines take them under this name."""
    from rlinf_ext.assets.core.models import TinyQwen2Shape, make_qwen2, save_hf_model
    from rlinf_ext.assets.core.tokenizer import train_tokenizer

    texts = [
        f"Question {i}: which city is the capital of country {i % 17}? <search> capital of country {i % 17} "
        f"</search> <answer> city {i * 7 % 23} </answer>"
        for i in range(400)
    ]
    tok = train_tokenizer(texts, vocab_size=800)
    root = tmp_path_factory.mktemp("qwen2_head32")
    out = []
    for seed in (1, 2):
        model = make_qwen2(tok, TinyQwen2Shape(), seed=seed)
        save_hf_model(randomize_qwen2_(model, seed), tok, root / f"seed{seed}")
        out.append(root / f"seed{seed}")
    return tuple(out)


@pytest.fixture(scope="session")
def qwen2_head32_dirs(qwen2_head32_pair):
    """``qwen2_head32_pair`` as the in-process vLLM tests' models (``VLLM_MODEL_FIXTURES``)."""
    return qwen2_head32_pair


@pytest.fixture(scope="session")
def qwen2_5_vl_head32_dirs(tmp_path_factory):
    """Two tiny Qwen2.5-VL checkpoints of head size 32 (hidden 64, 2 heads, 1 KV head; vLLM's CPU attention refuses
    the tiny VL model's 16), every weight randomised (seeds 1 and 2; norms around 1), with a VL tokenizer trained on
    a few sentences and the image-only processor (registered for AutoProcessor): the vLLM VL tests' models. Built
    without the tiny assets (see ``pytest_collection_modifyitems``)."""
    from rlinf_ext.assets.mmsearch import models as vl_models

    texts = [
        f"Question {i}: which city shows this emblem? <reason> the colour is {('red', 'blue')[i % 2]} </reason> "
        f"<search><img></search> <text_search> city {i % 13} </text_search> <answer> city {i * 7 % 23} </answer>"
        for i in range(300)
    ]
    tok = vl_models.train_vl_tokenizer(texts, vocab_size=600)
    processor = vl_models.make_processor(tok)
    shape = vl_models.TinyVLShape(hidden_size=64, num_attention_heads=2, num_key_value_heads=1)
    root = tmp_path_factory.mktemp("qwen2_5_vl_head32")
    out = []
    for seed in (1, 2):
        model = vl_models.make_qwen2_5_vl(tok, shape, seed)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                base = 1.0 if "norm" in name.rsplit(".", 2)[-2] or name.endswith("ln_q.weight") else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))
        vl_models.save_vl_model(model, processor, root / f"seed{seed}")
        out.append(root / f"seed{seed}")
    return tuple(out)
