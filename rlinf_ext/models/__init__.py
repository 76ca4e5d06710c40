"""Facts about the model shared by training and conversion: Qwen2 dimensions and layer-norm names
(``qwen2``), the Megatron-core ``GPTModel`` builder (``megatron``), the CPU shims Megatron needs without CUDA
(``cpu_shims``), the dtype-name table (``dtypes``), the actor's memory arithmetic (``memory``) and the resident-memory
sampler the CPU memory benchmarks share (``rss``). Nothing is
imported here: ``qwen2`` and ``memory`` stay light."""
