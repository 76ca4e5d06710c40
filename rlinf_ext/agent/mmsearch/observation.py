"""MMSearch-R1 observations as ids: the user turn after a search, with each image's pad run expanded.

The whole observation text is encoded at once and then every `<|image_pad|>` is expanded to the image's
token count, which gives exactly the ids the processor produces for (text, images). Text-search results are
cut by tokens (`max_obs_length`), never by characters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlinf_ext.agent.mmsearch.prompts import Prompts
from rlinf_ext.protocol.images import ImageRef, image_pad_count
from rlinf_ext.protocol.vl_tokens import IMAGE_PAD, expand_image_pads, token_id

TURN_OPEN = "<|im_end|>\n<|im_start|>user\n"
TURN_CLOSE = "<|im_end|>\n<|im_start|>assistant\n"


@dataclass
class Observation:
    ids: list[int]
    text: str  # before pad expansion
    images: list[ImageRef]
    image_tokens: int  # expanded <|image_pad|> ids among `ids`
    truncated: bool = False


def text_results_body(tokenizer: Any, prompts: Prompts, documents: list[Any], max_tokens: int) -> tuple[str, bool]:
    """`{i}. (title) text` lines, cut to `max_tokens` tokens (the header not counted)."""
    body = "".join(f"{i}. ({d.title}) {d.text}\n" for i, d in enumerate(documents, start=1))
    ids = tokenizer.encode(body, add_special_tokens=False)
    if len(ids) <= max_tokens:
        return prompts.text_results_header + body, False
    return prompts.text_results_header + tokenizer.decode(ids[:max_tokens]) + "\n", True


def failure_body(prompts: Prompts, error: str) -> str:
    return prompts.search_failed.replace("{error}", error)


def build_observation(
    processor: Any,
    prompts: Prompts,
    body: str,
    images: list[ImageRef],
    question: str,
    instruction: str,
    after_im_end: bool,
    truncated: bool = False,
) -> Observation:
    """The observation ids (mask 0). `after_im_end`: the turn already ended with `<|im_end|>`."""
    user = (
        prompts.observation.replace("{results}", body)
        .replace("{question}", question)
        .replace("{instruction}", instruction)
    )
    text = (TURN_OPEN[len("<|im_end|>") :] if after_im_end else TURN_OPEN) + user + TURN_CLOSE
    raw = processor.tokenizer.encode(text, add_special_tokens=False)
    pads = [image_pad_count(processor.image_processor, ref) for ref in images]
    ids = expand_image_pads(raw, token_id(processor.tokenizer, IMAGE_PAD), pads)
    return Observation(ids=ids, text=text, images=list(images), image_tokens=sum(pads), truncated=truncated)
