"""How fair a starting point the tiny MM warm start is for the search penalty, on the `search_free` (colour) questions.

    python benchmarks/mm_warm_start_probe.py ASSETS [--model DIR]

Not a test: it measures. Teacher-forced on the warm start's own scripted turn texts
(`assets/mmsearch/trajectories.py`), per colour question of the train and test splits:
- P(image search first): the image-search turn's probability against the likeliest direct answer turn's
  (the two openings the warm start was taught), and the share where the search is the likelier one (greedy);
- direct accuracy: the colour whose answer turn is likeliest right after the question;
- searched accuracy: the same after the image-search turn and its cached results (the real loop builds them);
- the direct accuracy on fresh jitters of the held-out cities' emblems (6 per city).
The search penalty can teach "answer directly" only if the direct answers are right about as often as the
searched ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from rlinf_ext.agent.mmsearch.loop import LoopSettings, SearchTools, first_prompt_ids, run_trajectory  # noqa: E402
from rlinf_ext.agent.mmsearch.prompts import Prompts  # noqa: E402
from rlinf_ext.agent.mmsearch.types import Task  # noqa: E402
from rlinf_ext.assets.core.playback import PlaybackGenerator  # noqa: E402
from rlinf_ext.assets.core.search import CorpusTextSearch, corpus_retriever  # noqa: E402
from rlinf_ext.assets.mmsearch.paths import layout  # noqa: E402
from rlinf_ext.assets.mmsearch.sft import PX  # noqa: E402
from rlinf_ext.assets.mmsearch.trajectories import IMAGE_SEARCH_TURN, colour_answer_turn  # noqa: E402
from rlinf_ext.assets.mmsearch.world import KIND_COLOUR, PALETTE, EmblemSpec, draw_emblem  # noqa: E402
from rlinf_ext.config.schema import ImageSearchToolConfig  # noqa: E402
from rlinf_ext.data.fvqa import read_fvqa  # noqa: E402
from rlinf_ext.generation.hf_vl import ImageInputs, load_vl_processor  # noqa: E402
from rlinf_ext.protocol.images import canonicalize  # noqa: E402
from rlinf_ext.protocol.vl_tokens import mm_token_type_ids  # noqa: E402
from rlinf_ext.tools.image_search import ImageSearch  # noqa: E402

COLOUR_QUESTION = "What colour is the emblem in the image?"
FRESH_PER_CITY = 6


class Scorer:
    def __init__(self, model, processor):
        self.model, self.tok = model, processor.tokenizer
        self.images = ImageInputs(processor.image_processor, capacity=4096)
        self.search_ids = self._ids(IMAGE_SEARCH_TURN)
        self.answer_ids = {c: self._ids(colour_answer_turn(c)) for c in PALETTE}

    def _ids(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def logprob(self, prefix: list[int], continuation: list[int], images: list) -> float:
        ids = torch.tensor([prefix + continuation])
        extra = {
            **self.images.batch(images),
            "mm_token_type_ids": mm_token_type_ids(ids, self.model.config.image_token_id),
        }
        with torch.no_grad():
            lp = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), **extra).logits.log_softmax(-1)[0]
        return sum(float(lp[len(prefix) - 1 + i, t]) for i, t in enumerate(continuation))

    def answers(self, prefix: list[int], images: list) -> dict[str, float]:
        return {c: self.logprob(prefix, ids, images) for c, ids in self.answer_ids.items()}

    def p_search(self, prefix: list[int], images: list, answers: dict[str, float]) -> float:
        return 1.0 / (1.0 + math.exp(max(answers.values()) - self.logprob(prefix, self.search_ids, images)))


def searched_context(processor, task: Task, cache: Path, corpus: Path) -> tuple[list[int], list]:
    """Prompt + the image-search turn + its observation, as the real loop builds them."""
    config = ImageSearchToolConfig(
        backend="cache_dir", cache_path=str(cache), topk=3, thumbnail_min_pixels=PX, thumbnail_max_pixels=PX
    )
    tools = SearchTools(ImageSearch(config), CorpusTextSearch(corpus_retriever(corpus), 3))
    settings = LoopSettings(
        max_gen_round=3, image_search_limit=1, text_search_limit=1, response_length_total=4096, max_obs_length=320
    )
    final = colour_answer_turn("red")
    playback = PlaybackGenerator(processor.tokenizer)
    playback.start([IMAGE_SEARCH_TURN, final])
    t = asyncio.run(run_trajectory(playback, processor, tools, task, settings, prompts=Prompts()))
    n_final = len(processor.tokenizer.encode(final, add_special_tokens=False))
    return (t.prompt_ids + t.response_ids)[:-n_final], list(t.images)


def probe_split(scorer: Scorer, processor, fvqa: Path, cache: Path, corpus: Path) -> dict[str, float]:
    rows = []
    for r in read_fvqa(fvqa, PX, PX):
        if r.data_source != f"tinymm_{KIND_COLOUR}":
            continue
        task = Task.from_row(r)
        prompt, images = first_prompt_ids(processor, Prompts(), task), list(task.images)
        direct = scorer.answers(prompt, images)
        searched = scorer.answers(*searched_context(processor, task, cache, corpus))
        gold = task.answers[0]
        rows.append(
            (
                scorer.p_search(prompt, images, direct),
                max(direct, key=direct.get) == gold,
                max(searched, key=searched.get) == gold,
            )
        )
    n = len(rows)
    return {
        "n": n,
        "mean_p_search": sum(r[0] for r in rows) / n,
        "greedy_search": sum(r[0] > 0.5 for r in rows) / n,
        "direct_accuracy": sum(r[1] for r in rows) / n,
        "searched_accuracy": sum(r[2] for r in rows) / n,
    }


def fresh_direct_accuracy(scorer: Scorer, processor, paths) -> float:
    specs = {c: EmblemSpec(**s) for c, s in json.loads(paths.emblems.read_text()).items()}
    cities = sorted({json.loads(line)["city"] for line in paths.test_paths.read_text().splitlines() if line.strip()})
    rng, right = random.Random(5), 0
    for city in cities:
        for _ in range(FRESH_PER_CITY):
            image = canonicalize(draw_emblem(specs[city], rng), PX, PX)
            task = Task("fresh", COLOUR_QUESTION, (image,), (specs[city].colour,), "search_free", "tinymm_colour")
            scores = scorer.answers(first_prompt_ids(processor, Prompts(), task), [image])
            right += max(scores, key=scores.get) == specs[city].colour
    return right / (FRESH_PER_CITY * len(cities))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("assets", type=Path, help="tiny assets directory with mm/ (make-tiny-assets --with-mm-sft)")
    parser.add_argument("--model", type=Path, default=None, help="VL checkpoint (default: the assets' warm start)")
    args = parser.parse_args(argv)
    from transformers import Qwen2_5_VLForConditionalGeneration

    torch.set_num_threads(1)
    paths = layout(args.assets)
    model_dir = args.model or paths.qwen2_5_vl_tiny_sft
    if not (model_dir / "config.json").is_file():
        parser.error(f"{model_dir} holds no model; build it with rlinf-ext make-tiny-assets --out DIR --with-mm-sft")
    processor = load_vl_processor(paths.processor_dir)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    scorer, corpus = Scorer(model, processor), args.assets / "corpus" / "wiki.jsonl"
    out = {
        split: probe_split(scorer, processor, fvqa, cache, corpus)
        for split, fvqa, cache in (
            ("train", paths.fvqa_train, paths.cache_train),
            ("test", paths.fvqa_test, paths.cache_test),
        )
    }
    out["fresh_test_cities_direct_accuracy"] = fresh_direct_accuracy(scorer, processor, paths)
    print(f"{'split':6} {'n':>3} {'P(search)':>9} {'greedy search':>13} {'direct acc':>10} {'searched acc':>12}")
    for split in ("train", "test"):
        r = out[split]
        print(
            f"{split:6} {r['n']:3d} {r['mean_p_search']:9.3f} {r['greedy_search']:13.3f} {r['direct_accuracy']:10.3f} "
            f"{r['searched_accuracy']:12.3f}"
        )
    print(f"direct accuracy on fresh jitters of the held-out cities: {out['fresh_test_cities_direct_accuracy']:.3f}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
