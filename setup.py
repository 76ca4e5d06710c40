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

GPU_REQUIREMENTS = [
    # Same pins as `rlinf[agentic-sglang]` / `rlinf[agentic-vllm]` 0.3.0.
    "sglang[all]==0.4.6.post5",
    "sglang-router",
    "torch-memory-saver",
    "vllm==0.8.5",
    "transformer-engine[pytorch]",
    "faiss-gpu-cu12>=1.11",  # IO_FLAG_MMAP_IFC
    "rlinf_latex2sympy2",
]

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
