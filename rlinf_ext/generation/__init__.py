"""Generation engines behind the ``protocol.generation.Generator`` contract (no Ray): ``hf`` (transformers, CPU),
``hf_vl`` (Qwen2.5-VL with images, CPU) and ``sglang`` (SGLang, GPU; plus the request/reply translation every
SGLang user shares)."""
