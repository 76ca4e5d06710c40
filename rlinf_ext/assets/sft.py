"""The warm-started tiny model: a short supervised pass on synthetic Search-R1 trajectories.

GRPO needs signal from its first step: a random model never closes an `<answer>` tag, so every reward is 0.
Here the tiny Qwen2 learns the format and to copy an answer out of the `<information>` block, and also, on
about half of the questions, to give up without searching (`trajectories.ABSTAIN_TEXT`): the behaviour the
tiny RL run then has to unlearn by finding that searching pays, as Search-R1's RL teaches a model to call
its search engine.
The loss covers only what the model itself would generate (think/search/answer); the prompt and the
observation are masked, as in the RL loss. The test files are never trained on.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from rlinf_ext.assets import trajectories
from rlinf_ext.assets.formats import read_jsonl, searchr1_prompt
from rlinf_ext.assets.models import TinyQwen2Shape, make_qwen2, save_hf_model
from rlinf_ext.assets.qa import Question, split_questions
from rlinf_ext.assets.world import build_world


@dataclass(frozen=True)
class SFTConfig:
    # Twice as wide as the contract's qwen2-tiny (hidden 128, FFN 352; 0.63M parameters). Measured with the
    # default seed (greedy EM on the 140 test questions, gold observations / own searches): hidden 64 at 600
    # steps, lr 1e-2 reached 0.26 / 0.06 and sampled (T=1) only 0.03 on the train prompts the RL run uses;
    # this shape at 700 steps, lr 5e-3 reaches 0.60 / 0.39, and 0.52 sampled on the train prompts.
    shape: TinyQwen2Shape = TinyQwen2Shape(hidden_size=128, intermediate_size=352)
    steps: int = 700  # optimizer steps (~14 epochs of the 400 train trajectories)
    batch_size: int = 8  # sequences per step
    lr: float = 5e-3  # peak; linear warmup then cosine to lr/10
    warmup_steps: int = 20
    weight_decay: float = 0.01
    clip_grad: float = 1.0
    copy_weight: float = 5.0  # loss weight of tokens copied from an observation (others: 1)
    # Phase 2, after the search SFT above: a short pass on the same search batches plus twice as many give-up
    # trajectories (`trajectories.ABSTAIN_TEXT`), after which the model gives up (answers "unknown" without
    # searching) with probability 0.65 on the train prompts and greedily on every test question, like a model
    # that was never taught to use its tool. Learning to search instead is the behaviour Search-R1's RL is
    # about, and a decision GRPO moves within the tiny run's 30 steps. Measured alternatives: give-up batches
    # from the start of the SFT cost the copy skill most of its accuracy (greedy EM with gold documents
    # 0.60 -> 0.29-0.46 over four variants); this short pass keeps it (0.65). abstain_steps=0: search only.
    abstain_steps: int = 80
    abstain_lr: float = 1e-3
    abstain_fraction: float = 1.0  # share of train questions with a give-up trajectory
    # give-up trajectories per step, in their own (short) batch: 8 (as many as search ones) gave a give-up
    # probability of about 0.25, 32 gave 0.79
    abstain_batch_size: int = 16
    topk: int = 3  # documents per observation, as the retrieval server's default
    # One thread: on a busy 2-core machine two OpenMP threads ran ~8x slower than one (oversubscription).
    threads: int = 1


@dataclass
class Example:
    input_ids: list[int]
    loss_mask: list[int]  # 1 on tokens the model generates (think/search/answer), 0 on prompt and observation
    copy_mask: list[int]  # 1 on generated tokens copied from an observation (a subset of loss_mask)


def encode_trajectory(tokenizer, prompt: str, segments: list[trajectories.Segment]) -> Example:
    """Tokenise the prompt and each segment separately, as the agent loop does, and build the masks."""
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    mask = [0] * len(ids)
    copy = [0] * len(ids)
    for seg in segments:
        enc = tokenizer(seg.text, add_special_tokens=False, return_offsets_mapping=True)
        ids += enc["input_ids"]
        mask += [1 if seg.trainable else 0] * len(enc["input_ids"])
        copy += [int(seg.trainable and any(a < e and b > s for s, e in seg.copied)) for a, b in enc["offset_mapping"]]
    return Example(ids, mask, copy)


def chat_prompt(tokenizer, question: str) -> str:
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


def build_abstain_examples(tokenizer, questions: list[Question], fraction: float, seed: int) -> list[Example]:
    """For a ``fraction`` of ``questions`` (drawn with ``seed``): the trajectory that gives up without searching."""
    rng = random.Random(seed)
    return [encode_trajectory(tokenizer, chat_prompt(tokenizer, q.question), trajectories.abstain_segments())
            for q in questions if rng.random() < fraction]


def _batch(examples: list[Example], pad_id: int, copy_weight: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and per-token loss weights (0 where no loss)."""
    n = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), n), pad_id, dtype=torch.long)
    attn = torch.zeros((len(examples), n), dtype=torch.long)
    weights = torch.zeros((len(examples), n), dtype=torch.float32)
    for i, e in enumerate(examples):
        L = len(e.input_ids)
        ids[i, :L] = torch.tensor(e.input_ids)
        attn[i, :L] = 1
        weights[i, :L] = torch.tensor(e.loss_mask, dtype=torch.float32) + (copy_weight - 1.0) * torch.tensor(e.copy_mask, dtype=torch.float32)
    return ids, attn, weights


def weighted_lm_loss(logits: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy, weighted per target token: sum(w * ce) / sum(w)."""
    ce = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), reduction="none")
    w = weights[:, 1:].flatten()
    return (ce * w).sum() / w.sum().clamp_min(1e-8)


def lr_at(step: int, cfg: SFTConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_sft(model, examples: list[Example], cfg: SFTConfig, seed: int, pad_id: int, progress: bool = True,
              abstain_examples: list[Example] | None = None) -> list[float]:
    """Plain torch loop (AdamW, warmup + cosine); returns the loss of every step.

    ``abstain_examples`` (short give-up trajectories) go in a second batch of ``cfg.abstain_batch_size`` per
    step, so they neither pad to the length of a search trajectory nor take its place in the batch.
    """
    threads_before = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _train_loop(model, examples, abstain_examples or [], cfg, seed, pad_id, progress)
    finally:
        torch.set_num_threads(threads_before)


class _Sampler:
    """Epochs of a shuffled index list, drawn ``size`` at a time."""

    def __init__(self, n: int, gen: torch.Generator):
        self.n, self.gen, self.order = n, gen, []

    def take(self, size: int) -> list[int]:
        while len(self.order) < size:
            self.order += torch.randperm(self.n, generator=self.gen).tolist()
        picked, self.order = self.order[:size], self.order[size:]
        return picked


def _train_loop(model, examples: list[Example], abstain: list[Example], cfg: SFTConfig, seed: int, pad_id: int,
                progress: bool) -> list[float]:
    from tqdm import tqdm

    gen = torch.Generator().manual_seed(seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=cfg.lr, betas=(0.9, 0.98))
    model.train()
    losses = []
    sampler = _Sampler(len(examples), gen)
    # its own generator: the search batches are drawn exactly as without give-up trajectories
    abstain_sampler = (_Sampler(len(abstain), torch.Generator().manual_seed(seed + 1))
                       if abstain and cfg.abstain_batch_size > 0 else None)
    bar = tqdm(range(cfg.steps), desc="warm-start SFT", disable=not progress)
    for step in bar:
        batches = [[examples[i] for i in sampler.take(cfg.batch_size)]]
        if abstain_sampler is not None:
            batches.append([abstain[i] for i in abstain_sampler.take(cfg.abstain_batch_size)])
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        # one weighted token mean over both batches: sum(w * ce) / sum(w)
        total, weight_sum = 0.0, 0.0
        for batch in batches:
            ids, attn, weights = _batch(batch, pad_id, cfg.copy_weight)
            total = total + weighted_lm_loss(model(input_ids=ids, attention_mask=attn).logits, ids, weights) * weights[:, 1:].sum()
            weight_sum += float(weights[:, 1:].sum())
        loss = total / max(weight_sum, 1e-8)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_grad)
        opt.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    return losses


def build_sft_model(assets, seed: int, log: Callable[..., None], cfg: SFTConfig | None = None) -> dict:
    """Train and save `models/qwen2-tiny-sft` from the train split; returns (and saves) a training report."""
    from transformers import AutoTokenizer

    cfg = cfg or SFTConfig()
    tok = AutoTokenizer.from_pretrained(assets.tokenizer_dir)
    splits = split_questions(build_world(seed), seed)
    retriever = corpus_retriever(assets.corpus_path)
    t0, cpu0 = time.perf_counter(), time.process_time()
    train_questions = [q for _, q in splits.train]
    examples = build_examples(tok, train_questions, retriever, cfg.topk)
    model = make_qwen2(tok, cfg.shape, seed + 3)
    losses = train_sft(model, examples, cfg, seed, tok.pad_token_id, progress=True)
    abstain: list[Example] = []
    # the search-only model (before the give-up pass): a reference point, and a start that always searches
    save_hf_model(model, tok, Path(assets.root) / "models" / "qwen2-tiny-sft-search")
    if cfg.abstain_steps > 0:
        abstain = build_abstain_examples(tok, train_questions, cfg.abstain_fraction, seed + 5)
        phase2 = replace(cfg, steps=cfg.abstain_steps, lr=cfg.abstain_lr, warmup_steps=min(5, cfg.abstain_steps))
        losses += train_sft(model, examples, phase2, seed + 7, tok.pad_token_id, progress=True, abstain_examples=abstain)
    train_s, train_cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    out = Path(assets.root) / "models" / "qwen2-tiny-sft"
    save_hf_model(model, tok, out)
    report = {"config": asdict(cfg), "train_examples": len(examples), "abstain_examples": len(abstain),
              "train_questions": len(splits.train),
              # CPU seconds tell the cost on a busy machine, where wall time mostly measures the neighbours
              "train_seconds": round(train_s, 1), "train_cpu_seconds": round(train_cpu_s, 1), "first_loss": round(losses[0], 4),
              "last_loss": round(sum(losses[-10:]) / len(losses[-10:]), 4)}
    (out / "sft_report.json").write_text(json.dumps(report, indent=1) + "\n")
    log(f"sft: {len(examples)} search + {len(abstain)} give-up trajectories, {cfg.steps} + {cfg.abstain_steps if abstain else 0} steps in {train_s:.0f}s ({train_cpu_s:.0f} CPU s), loss {report['first_loss']} -> "
        f"{report['last_loss']} -> {out}")
    return report


def corpus_retriever(corpus_path: Path) -> trajectories.LexicalRetriever:
    return trajectories.LexicalRetriever([r["contents"] for r in read_jsonl(corpus_path)])
