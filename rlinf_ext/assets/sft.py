"""The warm-started tiny model: a short supervised pass on synthetic Search-R1 trajectories.

GRPO needs signal from its first step: a random model never closes an `<answer>` tag, so every reward is 0.
Here a slightly larger tiny Qwen2 learns the format and to copy an answer out of the `<information>` block.
The loss covers only what the model itself would generate (think/search/answer); the prompt and the
observation are masked, as in the RL loss. The test files are never trained on.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from rlinf_ext.assets import trajectories
from rlinf_ext.assets.models import TinyQwen2Shape, make_qwen2, save_hf_model
from rlinf_ext.assets.qa import Question


@dataclass(frozen=True)
class SFTConfig:
    shape: TinyQwen2Shape = TinyQwen2Shape(num_hidden_layers=2, hidden_size=128, intermediate_size=352,
                                           num_attention_heads=4, num_key_value_heads=2)
    steps: int = 200  # optimizer steps
    batch_size: int = 8  # sequences per step
    lr: float = 3e-3  # peak; linear warmup then cosine to lr/10
    warmup_steps: int = 20
    weight_decay: float = 0.01
    clip_grad: float = 1.0
    topk: int = 3  # documents per observation, as the retrieval server's default
    # One thread: on a busy 2-core machine two OpenMP threads ran ~8x slower than one (oversubscription).
    threads: int = 1


@dataclass
class Example:
    input_ids: list[int]
    loss_mask: list[int]  # 1 on tokens the model generates (think/search/answer), 0 on prompt and observation


def encode_trajectory(tokenizer, prompt: str, segments: list[trajectories.Segment]) -> Example:
    """Tokenise the prompt and each segment separately, as the agent loop does, and build the loss mask."""
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    mask = [0] * len(ids)
    for seg in segments:
        seg_ids = tokenizer.encode(seg.text, add_special_tokens=False)
        ids += seg_ids
        mask += [1 if seg.trainable else 0] * len(seg_ids)
    return Example(ids, mask)


def chat_prompt(tokenizer, question: str) -> str:
    from rlinf_ext.assets.formats import searchr1_prompt

    return tokenizer.apply_chat_template([{"role": "user", "content": searchr1_prompt(question)}],
                                         tokenize=False, add_generation_prompt=True)


def observation_has_answers(q: Question, observations: list[str]) -> bool:
    return all(hop.fact.sentence in obs for hop, obs in zip(q.hops, observations))


def build_examples(tokenizer, questions: list[Question], retriever: trajectories.LexicalRetriever, topk: int) -> list[Example]:
    """Trajectories whose retrieved documents contain every hop's answer (others would teach guessing).

    Every other example keeps a newline before `</information>`, so that both observation layouts in use
    (Search-R1's stripped one and ours) look familiar to the model.
    """
    out = []
    for i, q in enumerate(questions):
        obs = trajectories.gold_observations(q, retriever, topk, trailing_newline=bool(i % 2))
        if observation_has_answers(q, obs):
            out.append(encode_trajectory(tokenizer, chat_prompt(tokenizer, q.question), trajectories.trajectory_segments(q, obs)))
    return out


def _batch(examples: list[Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), n), pad_id, dtype=torch.long)
    attn = torch.zeros((len(examples), n), dtype=torch.long)
    labels = torch.full((len(examples), n), -100, dtype=torch.long)
    for i, e in enumerate(examples):
        L = len(e.input_ids)
        ids[i, :L] = torch.tensor(e.input_ids)
        attn[i, :L] = 1
        labels[i, :L] = torch.where(torch.tensor(e.loss_mask, dtype=torch.bool), torch.tensor(e.input_ids), -100)
    return ids, attn, labels


def lr_at(step: int, cfg: SFTConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_sft(model, examples: list[Example], cfg: SFTConfig, seed: int, pad_id: int, progress: bool = True) -> list[float]:
    """Plain torch loop (AdamW, warmup + cosine); returns the loss of every step."""
    from tqdm import tqdm

    gen = torch.Generator().manual_seed(seed)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(0.9, 0.98))
    model.train()
    losses = []
    order: list[int] = []
    bar = tqdm(range(cfg.steps), desc="warm-start SFT", disable=not progress)
    for step in bar:
        if len(order) < cfg.batch_size:
            order += torch.randperm(len(examples), generator=gen).tolist()
        picked, order = order[: cfg.batch_size], order[cfg.batch_size:]
        ids, attn, labels = _batch([examples[i] for i in picked], pad_id)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
        opt.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    torch.set_num_threads(threads_before)
    return losses


def build_sft_model(assets, seed: int, log: Callable[..., None], cfg: SFTConfig | None = None) -> dict:
    """Train and save `models/qwen2-tiny-sft` from the train split; returns (and saves) a training report."""
    from transformers import AutoTokenizer

    from rlinf_ext.assets.qa import split_questions
    from rlinf_ext.assets.world import build_world

    cfg = cfg or SFTConfig()
    tok = AutoTokenizer.from_pretrained(assets.tokenizer_dir)
    splits = split_questions(build_world(seed), seed)
    retriever = corpus_retriever(assets.corpus_path)
    t0 = time.perf_counter()
    examples = build_examples(tok, [q for _, q in splits.train], retriever, cfg.topk)
    model = make_qwen2(tok, cfg.shape, seed + 3)
    losses = train_sft(model, examples, cfg, seed, tok.pad_token_id, progress=True)
    train_s = time.perf_counter() - t0
    out = Path(assets.root) / "models" / "qwen2-tiny-sft"
    save_hf_model(model, tok, out)
    report = {"config": asdict(cfg), "train_examples": len(examples), "train_questions": len(splits.train),
              "train_seconds": round(train_s, 1), "first_loss": round(losses[0], 4),
              "last_loss": round(sum(losses[-10:]) / len(losses[-10:]), 4),
              "torch_threads": torch.get_num_threads()}
    (out / "sft_report.json").write_text(json.dumps(report, indent=1) + "\n")
    log(f"sft: {len(examples)} trajectories, {cfg.steps} steps in {train_s:.0f}s, loss {report['first_loss']} -> "
        f"{report['last_loss']} -> {out}")
    return report


def corpus_retriever(corpus_path: Path) -> trajectories.LexicalRetriever:
    from rlinf_ext.assets.formats import read_jsonl

    return trajectories.LexicalRetriever([r["contents"] for r in read_jsonl(corpus_path)])
