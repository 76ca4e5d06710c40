"""The tiny evaluation end to end on CPU against a real BM25 retrieval server on loopback.

1. In-process: the real agent loop, search tool, server, tokenizer and reward, with a scripted reader as the
   generator (it searches the question, then answers the gold answer only if the retrieved passages contain
   it, so the EM depends on what the real server returned). The table is checked against the saved
   generations recomputed independently (``tests/support/eval_tables.py``), and resume is checked by growing
   `data.data_size`.
2. The validation pass on a fixed subset.
As a user runs it (the eval launcher with the tiny model on vLLM, against a running server): step 7 of the reference
recipe, tests/e2e/test_reference_recipe.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlinf_ext.protocol.generation import GenerationResult
from tests.support.eval_tables import check_tables_against_generations, recompute_em

ASSISTANT = "<|im_start|>assistant\n"


class ScriptedReader:
    """A ``protocol.generation.Generator``: turn 1 searches the question; turn 2 answers from the observation."""

    def __init__(self, tokenizer, golds_by_question: dict[str, list[str]]):
        self.tokenizer = tokenizer
        self.golds = golds_by_question
        self.questions_started = 0

    async def generate(self, prompt_ids, params) -> GenerationResult:
        text_so_far = self.tokenizer.decode(prompt_ids)
        question = re.search(r"Question: (.*?)\n", text_so_far).group(1)
        response = text_so_far.rsplit(ASSISTANT, 1)[1]
        if "<information>" not in response:
            self.questions_started += 1
            text, stop = f"<search> {question} </search>", "</search>"
        else:
            observation = response.rsplit("<information>", 1)[1]
            found = [g for g in self.golds[question] if g.lower() in observation.lower()]
            text, stop = f"<answer> {found[0] if found else 'unknown'} </answer>", "</answer>"
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) > params.max_new_tokens:
            ids = ids[: params.max_new_tokens]
            return GenerationResult(ids, self.tokenizer.decode(ids), "length")
        return GenerationResult(ids, self.tokenizer.decode(ids), "stop", matched_stop=stop)


def _eval_config(tiny_assets, url: str, out: Path, data_size: int, *extra: str):
    from rlinf_ext.config.loader import load_config

    return load_config(
        "tiny-cpu-eval",
        [
            f"paths.tiny_assets={tiny_assets.root}",
            f"rollout.model.model_path={tiny_assets.qwen2_tiny}",
            f"tools.search.server_addr={url.removeprefix('http://')}",
            "retrieval.launch=false",
            f"runner.output_dir={out}",
            f"data.data_size={data_size}",
            # the base world's seven benchmarks, two turns (tiny-cpu-eval itself evaluates the registry world)
            "data.val_data_paths=[" + ",".join(str(p) for p in tiny_assets.rlinf_test.values()) + "]",
            "agentloop.searchr1.max_turns=2",
            "agentloop.max_obs_length=320",
            *extra,
        ],
    )


@pytest.fixture(scope="module")
def scripted_reader(tiny_assets):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_assets.qwen2_tiny))
    golds = {}
    for path in tiny_assets.rlinf_test.values():
        for line in Path(path).read_text().splitlines():
            row = json.loads(line)
            golds[re.search(r"Question: (.*?)\n", row["prompt"]).group(1)] = row["solutions"]
    return ScriptedReader(tokenizer, golds)


@pytest.mark.timeout(180)
def test_tiny_eval_in_process_real_server_with_resume(tiny_assets, retrieval_url, scripted_reader, tmp_path):
    from rlinf_ext.eval.core.runner import EvalError
    from rlinf_ext.eval.searchr1.runner import run_evaluation

    reader = scripted_reader
    reader.questions_started = 0
    first = run_evaluation(_eval_config(tiny_assets, retrieval_url, tmp_path, 2), generator=reader, show_progress=False)
    assert (first.evaluated, first.resumed, first.errors) == (14, 0, 0)
    assert reader.questions_started == 14
    check_tables_against_generations(first.run_dir, 2)

    reader.questions_started = 0
    second = run_evaluation(
        _eval_config(tiny_assets, retrieval_url, tmp_path, 4), generator=reader, show_progress=False
    )
    assert (second.evaluated, second.resumed) == (14, 14) and reader.questions_started == 14  # only the new ones
    em = check_tables_against_generations(second.run_dir, 4)
    assert 0.0 < sum(em.values()) / len(em) < 1.0  # the real server found some answers and missed others

    rows = [json.loads(line) for line in (second.run_dir / "generations.jsonl").read_text().splitlines()]
    for row in rows:
        assert row["num_searches"] == 1 and row["search_failures"] == 0 and row["num_turns"] == 2
        assert row["turns"][0]["action"] == "search" and "<information>" in row["turns"][0]["observation"]
        assert row["prompt"].endswith(ASSISTANT) and row["question"] in row["prompt"]
    # a found answer really came from the server's passages
    hit = next(r for r in rows if r["scores"]["em"] == 1.0)
    assert hit["final_answer"].lower() in hit["turns"][0]["observation"].lower()
    results = json.loads((second.run_dir / "results.json").read_text())
    assert results["overall"]["mean_searches"] == 1.0 and results["meta"]["do_sample"] is False
    # the settings that move EM are recorded and stated above the score table
    assert {k: results["meta"][k] for k in ("max_turns", "precision", "on_no_action", "topk")} == {
        "max_turns": 2,
        "precision": "fp32",
        "on_no_action": "retry",
        "topk": 1,
    }
    assert "2 search turns, fp32, EOS without action: retry, top-1)" in (second.run_dir / "results.md").read_text()

    # switching to sampling in the same run directory would mix two decodings in one table: refused
    sampled = _eval_config(
        tiny_assets,
        retrieval_url,
        tmp_path,
        4,
        "algorithm.sampling_params.do_sample=true",
        "algorithm.sampling_params.temperature=1.0",
    )
    with pytest.raises(EvalError, match="do_sample"):
        run_evaluation(sampled, generator=reader, show_progress=False)
    # so would a different number of turns
    with pytest.raises(EvalError, match="max_turns: 2 -> 4"):
        run_evaluation(
            _eval_config(tiny_assets, retrieval_url, tmp_path, 4, "agentloop.searchr1.max_turns=4"),
            generator=reader,
            show_progress=False,
        )


@pytest.mark.timeout(120)
def test_validation_pass_on_a_fixed_subset(tiny_assets, retrieval_url, scripted_reader, tmp_path):
    from rlinf_ext.eval.searchr1.validation import ValidationPass

    # a training-style config: sampling on; the validation pass decodes greedily all the same
    cfg = _eval_config(tiny_assets, retrieval_url, tmp_path, -1, "algorithm.sampling_params.do_sample=true")
    seen_do_sample = []
    original = scripted_reader.generate

    async def spy(prompt_ids, params):
        seen_do_sample.append(params.do_sample)
        return await original(prompt_ids, params)

    scripted_reader.generate = spy
    try:
        val = ValidationPass(cfg, scripted_reader, samples_per_benchmark=2, out_dir=tmp_path / "val")
        metrics = val.run(step=5)
    finally:
        del scripted_reader.generate
    assert set(seen_do_sample) == {False}
    assert metrics["val/n"] == 14.0 and metrics["val/errors"] == 0.0
    rows = [json.loads(x) for x in (tmp_path / "val" / "global_step_5" / "generations.jsonl").read_text().splitlines()]
    em = recompute_em(rows)
    for bench, value in em.items():
        assert metrics[f"val/{bench}/em"] == pytest.approx(value)
        assert metrics[f"val/{bench}/searches"] == 1.0
    assert metrics["val/avg/em"] == pytest.approx(sum(em.values()) / len(em))
    assert {r["item_id"] for r in rows} == {it.item_id for it in val.items}  # the same subset every pass
