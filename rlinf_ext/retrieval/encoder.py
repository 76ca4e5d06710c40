"""Dense text encoder (e5 / bge style) through ``transformers``: prefixes, pooling, L2 norm, fp16 on GPU."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# retriever -> (pooling, query prefix, passage prefix)   (docs/searchr1-facts.md §3)
RETRIEVER_DEFAULTS: dict[str, tuple[str, str, str]] = {
    "e5": ("mean", "query: ", "passage: "),
    "bge": ("cls", "Represent this sentence for searching relevant passages: ", ""),
}


@dataclass(frozen=True)
class EncoderSpec:
    model_path: str
    pooling: str  # mean | cls
    query_prefix: str
    passage_prefix: str
    max_length: int = 256

    @classmethod
    def for_retriever(
        cls, retriever: str, model_path: str, max_length: int = 256, pooling: str | None = None
    ) -> EncoderSpec:
        if retriever not in RETRIEVER_DEFAULTS:
            raise ValueError(f"unknown dense retriever '{retriever}'; choose one of {sorted(RETRIEVER_DEFAULTS)}")
        default_pooling, qp, pp = RETRIEVER_DEFAULTS[retriever]
        pooling = pooling or default_pooling
        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls', got '{pooling}'")
        return cls(
            model_path=str(model_path), pooling=pooling, query_prefix=qp, passage_prefix=pp, max_length=max_length
        )


def pool(last_hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """Mean over the unmasked tokens (e5) or the first token (bge), then L2-normalised (inner product = cosine)."""
    if pooling == "cls":
        pooled = last_hidden[:, 0]
    else:
        mask = attention_mask.unsqueeze(-1).to(last_hidden.dtype)
        pooled = (last_hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
    return torch.nn.functional.normalize(pooled.float(), p=2, dim=-1)


class TextEncoder:
    """Encode queries or passages into float32 L2-normalised vectors."""

    def __init__(
        self, spec: EncoderSpec, device: str = "cpu", threads: int | None = None, gpus: list[int] | None = None
    ) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.spec = spec
        self.device = torch.device(f"cuda:{gpus[0]}") if gpus else torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(spec.model_path)
        dtype = torch.float16 if self.device.type == "cuda" else torch.float32
        self.model = AutoModel.from_pretrained(spec.model_path, dtype=dtype).to(self.device).eval()
        # several GPUs: torch's DataParallel splits every batch over them (build-index --gpus; not GPU-verified)
        self.forward = torch.nn.DataParallel(self.model, device_ids=gpus) if gpus and len(gpus) > 1 else self.model
        self.dim = int(self.model.config.hidden_size)
        # CPU intra-op threads while encoding (None: torch's default). On a shared, oversubscribed machine
        # fewer threads can be much faster (OpenMP workers spin waiting for each other).
        self.threads = threads

    def encode(self, texts: list[str], *, is_query: bool, batch_size: int = 64) -> np.ndarray:
        if self.threads is None or self.device.type != "cpu":
            return self._encode(texts, is_query, batch_size)
        previous = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            return self._encode(texts, is_query, batch_size)
        finally:
            torch.set_num_threads(previous)

    @torch.inference_mode()
    def _encode(self, texts: list[str], is_query: bool, batch_size: int) -> np.ndarray:
        prefix = self.spec.query_prefix if is_query else self.spec.passage_prefix
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            chunk = [prefix + t for t in texts[start : start + batch_size]]
            batch = self.tokenizer(
                chunk, max_length=self.spec.max_length, padding=True, truncation=True, return_tensors="pt"
            ).to(self.device)
            hidden = self.forward(**batch).last_hidden_state
            out[start : start + len(chunk)] = pool(hidden, batch["attention_mask"], self.spec.pooling).cpu().numpy()
        return out
