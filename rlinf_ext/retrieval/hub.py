"""An encoder given as a local directory or as a Hugging Face hub id, resolved to a local directory once.

Everything after this point (loading, the fingerprint recorded in the index metadata, the path the server reopens)
works on a directory; a hub id is fetched through huggingface_hub's own cache (``snapshot_download``), so a second
call, and a call with ``HF_HUB_OFFLINE=1`` once the cache holds it, touches no network.
"""

from __future__ import annotations

import re
from pathlib import Path

# owner/name, as the hub spells repository ids (no leading dot or slash, exactly one slash)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# what transformers needs to load an encoder; the rest of a repo (onnx/, openvino/, tf/flax weights) is skipped
ENCODER_FILES = ["*.json", "*.txt", "*.model", "*.safetensors"]
ENCODER_FALLBACK_WEIGHTS = ["*.json", "*.txt", "*.model", "pytorch_model.bin"]


class EncoderNotFoundError(ValueError):
    """--model is neither a directory nor a hub id that could be fetched; the message names the fix."""


def is_hub_id(model: str) -> bool:
    return bool(_HUB_ID.match(model))


def _fetch_hint(model: str) -> str:
    return (
        f"download it once (`python examples/searchr1/download.py --save_path $WORK --what encoder` writes "
        f"$WORK/models/e5-base-v2, or `hf download {model} --local-dir DIR`) and pass --model DIR"
    )


def resolve_model_dir(model: str | Path) -> Path:
    """The local directory of the encoder ``model``: itself when it is a directory, else the hub snapshot of that id
    (fetched into the Hugging Face cache if missing). Raises EncoderNotFoundError naming the fix."""
    text = str(model)
    path = Path(text).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise EncoderNotFoundError(
            f"--model {text} is a file; pass the encoder's directory (config.json, tokenizer "
            "and weights), e.g. $WORK/models/e5-base-v2"
        )
    if not is_hub_id(text):
        raise EncoderNotFoundError(
            f"--model {text}: no such directory, and not a hub id (owner/name); " + _fetch_hint("intfloat/e5-base-v2")
        )
    import huggingface_hub

    try:
        snapshot = Path(huggingface_hub.snapshot_download(text, allow_patterns=ENCODER_FILES))
        if not any(snapshot.glob("*.safetensors")):  # an older repo with only PyTorch pickles
            snapshot = Path(huggingface_hub.snapshot_download(text, allow_patterns=ENCODER_FALLBACK_WEIGHTS))
    except Exception as e:  # hub errors come in many types (offline, not found, gated, network)
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise EncoderNotFoundError(
            f"--model {text}: cannot fetch it from the Hugging Face hub "
            f"({type(e).__name__}: {first_line}); " + _fetch_hint(text)
        ) from e
    return snapshot
