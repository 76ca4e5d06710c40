"""The registry world's tokenizer: the project's byte-level BPE for the scaffolding, every name one token.

The BPE (`assets/core/tokenizer.py`, Qwen2.5's layout) learns the prompt, the question templates, the turns and
the page titles; then every entity name and reading-phase name is added as one non-special token *with its
leading space* (`" Traril"`, `core.tokenizer.add_word_tokens`), after the tags and the special tokens. A name is
then one id wherever the world's texts put it (always after a space) and decodes to exactly its text, so a copy of
a name is a one-token decision.
"""

from __future__ import annotations

from rlinf_ext.assets.core import tokenizer as core_tokenizer
from rlinf_ext.assets.registry.world import RELATIONS, RegistryWorld

BPE_VOCAB_SIZE = 1000  # the scaffolding only: names never reach the BPE (they are added tokens)
PLACEHOLDER = "Xyz"  # stands for a name in the texts the BPE learns from


def scaffold_texts(prompt_of, turn_texts: list[str]) -> list[str]:
    """What the BPE learns from: every question, query and title template with a placeholder name, the chat
    prompt of a question (``prompt_of(question)``) and the agent's turn texts."""
    texts: list[str] = []
    for r in RELATIONS:
        question, query = r.question_of(PLACEHOLDER), r.query_of(PLACEHOLDER)
        texts += [question, query, f'"{r.title} registry 12"\n{PLACEHOLDER} {PLACEHOLDER}.', prompt_of(question)] * 5
    return texts + list(turn_texts) * 5


def build_tokenizer(world: RegistryWorld, prompt_of, turn_texts: list[str]):
    """The BPE on `scaffold_texts`, then one added token per name of ``world`` (entities and reading names)."""
    tok = core_tokenizer.train_tokenizer(scaffold_texts(prompt_of, turn_texts), vocab_size=BPE_VOCAB_SIZE)
    core_tokenizer.add_word_tokens(tok, world.all_names)
    return tok
