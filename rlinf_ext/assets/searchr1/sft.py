"""The base world's warm start: a short supervised pass on Search-R1 trajectories of the real agent loop.

A random model never closes an `<answer>` tag, so every end-to-end test of the pipeline would see reward 0. Here
the tiny Qwen2 learns the format and the answer turn after a search over the base world's corpus; the end-to-end
tests start from it (the tiny experiment's own world and warm start are `assets/registry/`).
Each trajectory is produced by the real Search-R1 loop (`agent.searchr1.loop.run_trajectory`) with a playback
engine that "samples" the planned turns (`trajectories.planned_turns`) and a BM25 search over the tiny corpus,
so the prompt, observation and mask ids are exactly what a rollout produces. The loss covers only the
model's own (mask-1) tokens, as in the RL loss (`assets/core/sft.py`, the loop both warm starts share). The test files
are never trained on.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from rlinf_ext.agent.core.types import Trajectory
from rlinf_ext.agent.searchr1.config import LoopSettings
from rlinf_ext.agent.searchr1.loop import run_trajectory
from rlinf_ext.assets.core import sft as sft_loop
from rlinf_ext.assets.core.models import TinyQwen2Shape, make_qwen2, save_hf_model
from rlinf_ext.assets.core.playback import PlaybackGenerator
from rlinf_ext.assets.core.search import CorpusTextSearch, corpus_retriever
from rlinf_ext.assets.core.sft import SFTExample, Stream
from rlinf_ext.assets.core.world import build_world
from rlinf_ext.assets.searchr1 import trajectories
from rlinf_ext.assets.searchr1.qa import Question, split_questions
from rlinf_ext.assets.searchr1.rows import chat_prompt
from rlinf_ext.protocol.generation import SamplingParams
from rlinf_ext.tools.search import TextSearch

SEARCH_DIR = "qwen2-tiny-sft-search"  # under models/

# the loop's limits while playing back: above any planned trajectory, so nothing is cut or refused
PLAYBACK_TOKENS = 8192
PLAYBACK_LOOP = LoopSettings(max_turns=8, response_length_total=PLAYBACK_TOKENS, max_obs_length=PLAYBACK_TOKENS)


@dataclass(frozen=True)
class SFTConfig:
    # Twice as wide as the contract's qwen2-tiny (hidden 128, FFN 352; 0.63M parameters). Measured with the
    # default seed (greedy EM on the 140 test questions, gold observations / own searches): hidden 64 at 600
    # steps, lr 1e-2 reached 0.26 / 0.06 and sampled (T=1) only 0.03 on the train prompts the RL run uses;
    # this shape at 700 steps, lr 5e-3 reaches 0.60 / 0.39, and 0.52 sampled on the train prompts.
    # 4 heads, 2 KV heads: head size 32, as vLLM's CPU attention needs (set here, not taken from the defaults)
    shape: TinyQwen2Shape = TinyQwen2Shape(
        hidden_size=128, intermediate_size=352, num_attention_heads=4, num_key_value_heads=2
    )
    steps: int = 700  # optimizer steps (~14 epochs of the 400 train trajectories)
    batch_size: int = 8  # sequences per step
    lr: float = 5e-3  # peak; linear warmup then cosine to lr/10
    warmup_steps: int = 20
    schedule: str = "cosine"
    weight_decay: float = 0.01
    clip_grad: float = 1.0
    copy_weight: float = 5.0  # loss weight of tokens copied from an observation (others: 1)
    topk: int = 3  # documents per observation, as the retrieval server's default
    # One thread: on a busy 2-core machine two OpenMP threads ran ~8x slower than one (oversubscription).
    threads: int = 1


def play_back(
    tokenizer, questions: list[Question], plans: list[list[trajectories.Segment]], search: Any
) -> list[Trajectory]:
    """The Search-R1 loop's trajectory of each question when the engine writes its planned turns."""
    gen = PlaybackGenerator(tokenizer)
    params = SamplingParams(max_new_tokens=PLAYBACK_TOKENS)

    async def all_of_them() -> list[Trajectory]:
        out = []
        for q, plan in zip(questions, plans):
            gen.start([turn.text for turn in plan])
            prompt_ids = tokenizer.encode(chat_prompt(tokenizer, q.question), add_special_tokens=False)
            out.append(
                await run_trajectory(
                    gen,
                    tokenizer,
                    prompt_ids,
                    list(q.answers),
                    PLAYBACK_LOOP,
                    [TextSearch(search)],
                    sampling_params=params,
                )
            )
        return out

    return asyncio.run(all_of_them())


def copy_weights(
    tokenizer, trajectory: Trajectory, plan: list[trajectories.Segment], copy_weight: float
) -> list[float]:
    """Per response token: 0 on observations, 1 on the model's tokens, `copy_weight` on those overlapping a
    planned turn's copied span."""
    weights: list[float] = []
    for turn, seg in zip(trajectory.turns, plan):
        enc = tokenizer(seg.text, add_special_tokens=False, return_offsets_mapping=True)
        if enc["input_ids"] != turn.response_ids:
            raise RuntimeError(f"turn {seg.text!r} was not played back as planned")
        weights += [
            copy_weight if any(a < e and b > s for s, e in seg.copied) else 1.0 for a, b in enc["offset_mapping"]
        ]
        weights += [0.0] * len(turn.observation_ids)
    return weights


def observation_has_answers(q: Question, observations: list[str]) -> bool:
    return all(hop.fact.sentence in obs for hop, obs in zip(q.hops, observations))


def build_examples(tokenizer, questions: list[Question], search: Any, copy_weight: float) -> list[SFTExample]:
    """The loop's trajectories of the planned turns, kept where every hop's observation holds the hop's fact
    (others would teach guessing)."""
    plans = [trajectories.planned_turns(q) for q in questions]
    out = []
    for q, plan, t in zip(questions, plans, play_back(tokenizer, questions, plans, search)):
        observations = [tokenizer.decode(turn.observation_ids) for turn in t.turns if turn.action == "search"]
        if t.end_reason == "answer" and observation_has_answers(q, observations):
            out.append(SFTExample.from_trajectory(t, copy_weights(tokenizer, t, plan, copy_weight)))
    return out


def train_sft(
    model, examples: list[SFTExample], cfg: SFTConfig, seed: int, pad_id: int, progress: bool = True
) -> list[float]:
    """The shared loop (`assets/core/sft.py`) on the search trajectories."""
    return sft_loop.train(model, [Stream(examples, cfg.batch_size, seed)], cfg, pad_id, progress=progress)


def _search_examples(assets, seed: int, cfg: SFTConfig):
    from transformers import AutoTokenizer  # lazy: transformers is heavy to import

    tok = AutoTokenizer.from_pretrained(assets.tokenizer_dir)
    splits = split_questions(build_world(seed), seed)
    search = CorpusTextSearch(corpus_retriever(assets.corpus_path), cfg.topk)
    train_questions = [q for _, q in splits.train]
    return tok, train_questions, build_examples(tok, train_questions, search, cfg.copy_weight)


def _report(cfg: SFTConfig, examples, n_questions: int, t0: float, cpu0: float, losses: list[float]) -> dict:
    return {
        "config": asdict(cfg),
        "train_examples": len(examples),
        "train_questions": n_questions,
        # CPU seconds tell the cost on a busy machine, where wall time mostly measures the neighbours
        "train_seconds": round(time.perf_counter() - t0, 1),
        "train_cpu_seconds": round(time.process_time() - cpu0, 1),
        "first_loss": round(losses[0], 4),
        "last_loss": round(sum(losses[-10:]) / len(losses[-10:]), 4),
    }


def build_sft_search_model(assets, seed: int, log: Callable[..., None], cfg: SFTConfig | None = None) -> dict:
    """Train and save `models/qwen2-tiny-sft-search` from the train split (what the end-to-end tests start from);
    returns (and saves) a training report."""
    cfg = cfg or SFTConfig()
    t0, cpu0 = time.perf_counter(), time.process_time()
    tok, train_questions, examples = _search_examples(assets, seed, cfg)
    model = make_qwen2(tok, cfg.shape, seed + 3)
    losses = train_sft(model, examples, cfg, seed, tok.pad_token_id, progress=True)
    out = Path(assets.root) / "models" / SEARCH_DIR
    save_hf_model(model, tok, out)
    report = _report(cfg, examples, len(train_questions), t0, cpu0, losses)
    (out / "sft_report.json").write_text(json.dumps(report, indent=1) + "\n")
    log(
        f"sft: {len(examples)} trajectories, {cfg.steps} steps in {report['train_seconds']:.0f}s "
        f"({report['train_cpu_seconds']:.0f} CPU s), loss {report['first_loss']} -> {report['last_loss']} -> {out}"
    )
    return report
