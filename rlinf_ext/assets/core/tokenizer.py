"""A small byte-level BPE tokenizer trained locally, with Qwen2.5's special tokens and chat template.

Layout mirrors Qwen2.5: Qwen's pre-tokenisation regex (digits split one by one) + byte-level BPE, NFC
normalisation, no BOS, the special tokens after the learned vocabulary, `<|endoftext|>` as pad and EOS
(Qwen2.5 base). The Search-R1 tags are added as *non-special* tokens: one id each, yet they survive
`skip_special_tokens` decoding, where the rollout's stop strings are matched.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

# Qwen2's pre-tokenisation pattern (as in its tokenizer.json)
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
TAG_TOKENS = (
    "<think>",
    "</think>",
    "<search>",
    "</search>",
    "<answer>",
    "</answer>",
    "<information>",
    "</information>",
)
DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def qwen2_5_chat_template() -> str:
    return resources.files("rlinf_ext.assets.core").joinpath("qwen2_5_chat_template.jinja").read_text(encoding="utf-8")


def train_tokenizer(
    texts: list[str],
    vocab_size: int = 2000,
    tags: tuple[str, ...] = TAG_TOKENS,
    specials: tuple[str, ...] = SPECIAL_TOKENS,
    chat_template: str | None = None,
    tokenizer_class=None,
    **wrapper_kwargs,
):
    """Train the BPE on `texts` and wrap it as a `PreTrainedTokenizerFast` (vocab_size counts learned tokens).

    `tags` become non-special added tokens, `specials` special ones (the first is EOS and pad); the VL tokenizer
    passes its own lists, Qwen2.5-VL's chat template and `Qwen2TokenizerFast`, which its processor requires."""
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(texts, trainer=trainer)
    # added after training so that, as in Qwen2.5, they follow the learned vocabulary
    tok.add_tokens(
        [AddedToken(t, special=False, normalized=False, single_word=False, lstrip=False, rstrip=False) for t in tags]
    )
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return (tokenizer_class or PreTrainedTokenizerFast)(
        tokenizer_object=tok,
        eos_token=specials[0],
        pad_token=specials[0],
        additional_special_tokens=list(specials[1:]),
        chat_template=chat_template or qwen2_5_chat_template(),
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
        **wrapper_kwargs,
    )


def word_token(word: str) -> str:
    """The added token of a word: the word with its leading space, as the texts always put it."""
    return f" {word}"


def add_word_tokens(tokenizer, words: list[str]) -> None:
    """Make every word of ``words`` one non-special token (its leading space included: `word_token`), after the
    vocabulary: a copy of a name is then a one-token decision, and the name decodes to exactly its text."""
    tokenizer.add_tokens(
        [
            AddedToken(word_token(w), special=False, normalized=False, single_word=False, lstrip=False, rstrip=False)
            for w in words
        ]
    )
    check_single_tokens(tokenizer, words)


def word_ids(tokenizer, words: list[str]) -> dict[str, int]:
    """word -> its one id (raises if a word is not one token)."""
    check_single_tokens(tokenizer, words)
    return {w: tokenizer.encode(word_token(w), add_special_tokens=False)[0] for w in words}


def check_single_tokens(tokenizer, words: list[str]) -> None:
    bad = [w for w in words if len(tokenizer.encode(word_token(w), add_special_tokens=False)) != 1]
    if bad:
        raise ValueError(
            f"{len(bad)} word(s) are not one token of this tokenizer, e.g. {bad[:3]}: add them with "
            "assets/core/tokenizer.add_word_tokens"
        )


def tokenizer_training_texts(
    corpus_contents: list[str], questions: list[str], prompt_example: str, extra: list[str]
) -> list[str]:
    """What the BPE learns from: the corpus, the questions, the prompt and chat scaffolding, the agent turns."""
    # special tokens are left out: they are whole tokens anyway and would only waste merges
    scaffold = f"system\n{DEFAULT_SYSTEM}\nuser\n{prompt_example}\nassistant\n"
    return list(corpus_contents) + list(questions) + [scaffold] * 20 + list(extra)


def save_tokenizer(tokenizer, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out_dir))
