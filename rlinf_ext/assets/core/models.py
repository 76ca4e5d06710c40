"""Random-initialised tiny Hugging Face checkpoints: Qwen2 causal LMs and a BERT encoder."""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class TinyQwen2Shape:
    """Qwen2 architecture knobs; the defaults are the contract's `qwen2-tiny`.

    Head size 32 (hidden 64 over 2 heads, 1 KV head): vLLM's CPU attention takes head sizes 32, 64, 80, ...
    and refuses 16, so the tiny model runs on the same rollout engine as the real ones.
    """

    num_hidden_layers: int = 2
    hidden_size: int = 64
    intermediate_size: int = 176
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = True


def padded_vocab_size(n_tokens: int, multiple: int = 64) -> int:
    """Round the tokenizer size up, as Qwen2.5 pads 151,665 tokens to 151,936 rows."""
    return ((n_tokens + multiple - 1) // multiple) * multiple


def qwen2_config(tokenizer, shape: TinyQwen2Shape):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=padded_vocab_size(len(tokenizer)),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.max_position_embeddings,
        max_window_layers=shape.num_hidden_layers,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        hidden_act="silu",
        tie_word_embeddings=shape.tie_word_embeddings,
        use_sliding_window=False,
        sliding_window=None,  # Qwen2.5 does not use it; None also silences a transformers warning
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
        attention_dropout=0.0,
    )


def generation_config(tokenizer):
    from transformers import GenerationConfig

    # as Qwen2.5-Instruct: stop at <|im_end|> (end of the assistant turn) or <|endoftext|>
    return GenerationConfig(
        eos_token_id=[tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")],
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )


def make_qwen2(tokenizer, shape: TinyQwen2Shape, seed: int):
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(qwen2_config(tokenizer, shape)).to(torch.float32)
    model.generation_config = generation_config(tokenizer)
    return model


def save_hf_model(model, tokenizer, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))


def make_bert_encoder(tokenizer, seed: int, hidden_size: int = 32, layers: int = 2, heads: int = 2):
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=hidden_size * 2,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    return BertModel(cfg, add_pooling_layer=True)


def build_wordpiece(texts: list[str], out_dir: Path, vocab_size: int = 1000):
    """A small uncased WordPiece vocabulary (BERT's scheme) for the encoder, as a `BertTokenizerFast`.

    Built by counting rather than with `tokenizers`' WordPiece trainer, whose alphabet order varies from
    run to run: here every character (plain and `##`-continuation) plus the most frequent words, ties
    broken alphabetically, so that the same texts always give the same file.
    """
    from transformers import BertTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words = collections.Counter(w for t in texts for w in re.findall(r"\w+|[^\w\s]", t.lower()))
    chars = sorted({c for w in words for c in w})
    vocab = specials + chars + ["##" + c for c in chars]
    room = max(0, vocab_size - len(vocab))
    vocab += [w for w, _ in sorted(words.items(), key=lambda kv: (-kv[1], kv[0])) if len(w) > 1][:room]
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab_file = out_dir / "vocab.txt"
    vocab_file.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return BertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=True, model_max_length=512)
