import pytest


@pytest.fixture(scope="module")
def tokenizer(tiny_assets):
    """The tiny assets' tokenizer (Qwen2.5's chat template)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_assets.tokenizer_dir))
