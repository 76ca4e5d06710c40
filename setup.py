"""Packaging for rlinf_ext.

CPU stack pins mirror rlinf==0.3.0's agentic extras (transformers 4.51.1) so that tokenisation and
configs behave the same on a laptop and on the GPU nodes. Install torch first (see README).
"""

from setuptools import find_packages, setup

CPU_REQUIREMENTS = [
    "rlinf==0.3.0",
    "torch>=2.5.0",  # CI installs torch==2.13.0 (CPU build) before this package
    "transformers==4.51.1",  # rlinf's agentic pin; transformers 5.x breaks several RLinf imports
    "tokenizers>=0.21,<0.22",
    "huggingface_hub>=0.30,<1.0",
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

# GPU nodes: `bash scripts/install.sh --gpu` (the order matters, see there); `python scripts/check_gpu_extras.py`
# proves with pip's resolver that these pins resolve together, without installing anything.
GPU_REQUIREMENTS = [
    # RLinf's own SGLang stack: sglang[all]==0.4.6.post5 (torch 2.6.0), sglang-router, transformers 4.51.1, ...
    # vLLM is not here: RLinf 0.3.0's VLLMWorker has no serving loop (`validate` refuses rollout_backend=vllm),
    # and vllm 0.8.5 pins xgrammar 0.1.18 where sglang 0.4.6.post5 pins 0.1.19 (the two cannot resolve together).
    "rlinf[agentic-sglang]==0.3.0",
    # sglang 0.4.6.post5 asks for >=0.0.4; 0.0.6 is the last release before it (2025-05-16 vs 2025-05-24) and has
    # the region()/pause()/resume()/configure_subprocess() API it calls (later releases add per-CUDA preloads).
    # A source build: it needs the CUDA toolkit headers on the node.
    "torch-memory-saver==0.0.6",
    # Transformer Engine's core library for CUDA 12 (sglang's torch 2.6.0 is cu124); megatron-core 0.16.1 accepts
    # >=2.9,<2.12. Its PyTorch extension (transformer_engine_torch, same version) is a source build that must
    # see the installed torch, so install.sh builds it afterwards with --no-build-isolation (pip would otherwise
    # build it against whatever torch its isolated build environment downloads).
    "transformer-engine[core_cu12]==2.10.0",
]
TE_TORCH_REQUIREMENT = "transformer_engine_torch==2.10.0"  # built by scripts/install.sh --gpu

# faiss-gpu and faiss-cpu (a base requirement) install the same `faiss` package and overwrite each other, so
# faiss-gpu is no extra: `bash scripts/install.sh --gpu --faiss-gpu` removes faiss-cpu, then installs this pin.
FAISS_GPU_REQUIREMENT = "faiss-gpu-cu12==1.14.1.post1"

DEV_REQUIREMENTS = [
    "pytest>=8",
    "pytest-timeout",
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
    extras_require={"gpu": GPU_REQUIREMENTS, "dev": DEV_REQUIREMENTS},
    entry_points={"console_scripts": ["rlinf-ext=rlinf_ext.cli:main"]},
)
