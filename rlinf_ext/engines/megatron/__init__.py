"""Megatron-core pieces shared by the actor and the converter: CPU shims and the Qwen2 GPTModel builder."""
