"""Retokenisation drift of MMSearch-R1 trajectories: do the loop's ids equal what the actor's processor makes of
the same conversation?

The loop builds a trajectory piece by piece: the sampled ids of each turn, then each observation encoded on its
own with its images' pad runs expanded (`observation.py`). The actor trains on those ids with the images processed
by the same processor (`training/fsdp_policy.py`). Two things can drift: the ids (a turn sampled as pieces that
BPE would merge, an observation whose first characters would merge with the end of the turn) and, worse, the
image pad runs (a run whose length is not the image's grid breaks the actor's vision forward). Per trajectory the
check decodes prompt + response (each pad run collapsed to one `<|image_pad|>`), runs the processor on that text
with the trajectory's images, and compares. The agent loop logs the shares per step (`agent/retokenize_mismatch`,
`agent/image_pad_mismatch`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlinf_ext.protocol import metric_keys as mk
from rlinf_ext.protocol.vl_tokens import IMAGE_PAD, token_id

RETOKENIZE_MISMATCH = mk.AGENT_RETOKENIZE_MISMATCH.removeprefix(f"{mk.AGENT_PREFIX}/")  # Trajectory.metrics names
IMAGE_PAD_MISMATCH = mk.AGENT_IMAGE_PAD_MISMATCH.removeprefix(f"{mk.AGENT_PREFIX}/")


def pad_runs(ids: Sequence[int], pad_id: int) -> list[int]:
    """Lengths of the runs of `pad_id` in `ids`, in order."""
    runs: list[int] = []
    previous = None
    for t in ids:
        if t == pad_id:
            if previous == pad_id:
                runs[-1] += 1
            else:
                runs.append(1)
        previous = t
    return runs


def collapse_pad_runs(ids: Sequence[int], pad_id: int) -> list[int]:
    """`ids` with every run of `pad_id` replaced by one `pad_id` (the text form of an image)."""
    return [t for i, t in enumerate(ids) if t != pad_id or i == 0 or ids[i - 1] != pad_id]


def count_mismatches(pairs: Sequence[tuple[Sequence[int], Sequence[int] | None]], pad_id: int) -> tuple[int, int]:
    """(trajectories whose ids differ, trajectories whose image pad runs differ) over `(loop ids, actor ids)`
    pairs; actor ids None = the processor refused the conversation (both count)."""
    ids_differ = pads_differ = 0
    for loop_ids, actor_ids in pairs:
        if actor_ids is None:
            ids_differ, pads_differ = ids_differ + 1, pads_differ + 1
            continue
        ids_differ += list(loop_ids) != list(actor_ids)
        pads_differ += pad_runs(loop_ids, pad_id) != pad_runs(actor_ids, pad_id)
    return ids_differ, pads_differ


def actor_ids(processor: Any, ids: Sequence[int], images: Sequence[Any]) -> list[int] | None:
    """The ids the processor produces for the conversation `ids` stands for (decoded with its pad runs collapsed)
    with `images` (`ImageRef`s in order); None when it refuses it (placeholders and images do not pair up)."""
    tok = processor.tokenizer
    text = tok.decode(
        collapse_pad_runs(ids, token_id(tok, IMAGE_PAD)), skip_special_tokens=False, clean_up_tokenization_spaces=False
    )
    try:
        out = processor(text=[text], images=[ref.to_pil() for ref in images] or None, return_tensors="pt")
    except ValueError:  # transformers: "Mismatch in `image` token count between text and `input_ids`" and kin
        return None
    return out.input_ids[0].tolist()


def mark_retokenize_mismatches(processor: Any, trajectories: Sequence[Any]) -> None:
    """Set `metrics[RETOKENIZE_MISMATCH]` and `metrics[IMAGE_PAD_MISMATCH]` (1.0 or 0.0) on each trajectory; their
    mean over a step's trajectories is the step's mismatch rate."""
    pad = token_id(processor.tokenizer, IMAGE_PAD)
    for t in trajectories:
        loop_ids = list(t.prompt_ids) + list(t.response_ids)
        ids_differ, pads_differ = count_mismatches([(loop_ids, actor_ids(processor, loop_ids, t.images))], pad)
        t.metrics[RETOKENIZE_MISMATCH] = float(ids_differ)
        t.metrics[IMAGE_PAD_MISMATCH] = float(pads_differ)
