"""Generation engines behind the ``protocol.generation.Generator`` contract (no Ray): ``hf`` (transformers, CPU)
and ``sglang`` (SGLang, GPU; plus the request/reply translation every SGLang user shares)."""
