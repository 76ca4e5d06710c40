"""Generation engines behind the ``protocol.generation.Generator`` contract (no Ray): ``hf`` (transformers, CPU),
``hf_vl`` (Qwen2.5-VL with images, CPU) and ``sglang_engine`` (SGLang, GPU); ``sglang_wire`` / ``sglang_vl``
translate requests and replies for every SGLang user, ``turn_end`` is every engine's end-of-turn rule."""
