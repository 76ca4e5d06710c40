"""rlinf_ext: declarative Search-R1 experiments on RLinf and Megatron-core."""

__version__ = "0.1.0"
