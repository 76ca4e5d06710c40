"""`SGLangEngineGenerator` on a fake SGLang engine (CPU; sglang is never imported).

`SimulatedSGLang` follows sglang 0.5.23's per-token finish check (`Req.update_finish_state`: stop strings in the
decoded tail first, then EOS / `stop_token_ids`, then the token budget) and its reply shape (`text` +
`output_ids` + `meta_info` with `finish_reason` and, with `return_logprob`, `output_token_logprobs` entries
`(logprob, token_id, text)`), on a scripted continuation. The generator's results are
compared with what `HFGenerator` makes of the same sampled tokens: the two engines must agree.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from rlinf_ext.generation.hf import HFGenerator, eos_token_ids
from rlinf_ext.generation.sglang_engine import (
    SGLangEngineGenerator,
    SGLangUnavailable,
    engine_kwargs,
    load_engine_class,
    usable_gpus,
)
from rlinf_ext.protocol.generation import GenerationResult, SamplingParams
from tests.support.sglang_fakes import RecordingEngine

STOPS = ["</search>", "</answer>", "<|im_end|>"]
REPO = Path(__file__).resolve().parents[2]
# validate accepts rollout_backend=sglang where the SGLang profile is installed: these configs validate as there
pytestmark = pytest.mark.usefixtures("sglang_profile_installed")


@pytest.fixture(scope="module")
def tokenizer(tiny_assets):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_assets.qwen2_tiny)


@pytest.fixture(scope="module")
def eos_ids(tiny_assets, tokenizer):
    from transformers import GenerationConfig

    return eos_token_ids(GenerationConfig.from_pretrained(tiny_assets.qwen2_tiny), tokenizer)


class SimulatedSGLang(RecordingEngine):
    """A fake engine (its calls checked against sglang's ``Engine``, tests/support/sglang_fakes.py): replays `script` (the
    tokens the model would sample) under SGLang's stopping rules."""

    def __init__(self, source, tokenizer, script: list[int], config_eos: int | None = None):
        super().__init__(source)
        self.tokenizer = tokenizer
        self.script = script
        self.config_eos = config_eos
        self.calls: list[dict] = []

    def _decode(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=bool(self.params.get("skip_special_tokens", True)))

    async def reply(self, arguments):
        input_ids, sampling_params, return_logprob = (
            arguments[k] for k in ("input_ids", "sampling_params", "return_logprob")
        )
        self.calls.append(
            {"input_ids": input_ids, "sampling_params": dict(sampling_params), "return_logprob": return_logprob}
        )
        self.params = p = sampling_params
        stop_token_ids = set(p.get("stop_token_ids") or []) | ({self.config_eos} if self.config_eos else set())
        stops = p.get("stop") or []
        tail_len = max((len(self.tokenizer(s, add_special_tokens=False)["input_ids"]) for s in stops), default=0)
        out, finish = [], None
        for token in self.script:
            out.append(token)
            tail = self.tokenizer.decode(out[-(tail_len + 1) :]) if stops else ""
            hit = next((s for s in stops if s in tail), None)
            if hit is not None:
                finish = {"type": "stop", "matched": hit}
                break
            if token in stop_token_ids:
                finish = {"type": "stop", "matched": token}
                break
            if len(out) >= p["max_new_tokens"]:
                finish = {"type": "length", "length": p["max_new_tokens"]}
                break
        assert finish is not None, "the script ran out before the engine stopped"
        text = self._decode(out)
        if not p.get("no_stop_trim", False) and isinstance(finish.get("matched"), str):
            text = text[: text.rfind(finish["matched"])]  # SGLang's detokenizer trims the matched stop string
        meta = {"id": "rid", "finish_reason": finish, "prompt_tokens": len(input_ids), "weight_version": "default"}
        if return_logprob:
            meta["output_token_logprobs"] = [(-0.5 - i, t, None) for i, t in enumerate(out)]
        return {"text": text, "output_ids": list(out), "meta_info": meta}


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def hf_result(tokenizer, eos_ids, script, params) -> GenerationResult:
    """What the CPU engine returns for the same sampled tokens (no model involved: the row's cut only)."""
    hf = HFGenerator.__new__(HFGenerator)
    hf.tokenizer, hf.eos_ids = tokenizer, set(eos_ids)
    return hf._result(list(script), params, None)


def generate(gen, prompt, params):
    return asyncio.run(gen.generate(prompt, params))


GREEDY = SamplingParams(max_new_tokens=64, do_sample=False, temperature=0.0, stop=STOPS)


@pytest.mark.parametrize(
    "continuation, budget, reason, matched",
    [
        ("<think> a</think>\n<search> x y</search>\n<answer> z", 64, "stop", "</search>"),
        ("<answer> z</answer> trailing", 64, "stop", "</answer>"),
        (" z y x<|endoftext|> a a", 64, "eos", None),
        ("<think> a a a a a a", 4, "length", None),
        # budget reached on the very token that ends the turn: it ends the turn (0.5.23 checks the budget last)
        ("<search> x</search> a a", 4, "stop", "</search>"),
        (" a b<|endoftext|> a", 3, "eos", None),
    ],
)
def test_replies_match_the_hf_engine(tokenizer, eos_ids, continuation, budget, reason, matched, sglang_source):
    script = encode(tokenizer, continuation)
    params = GREEDY.with_updates(max_new_tokens=budget)
    engine = SimulatedSGLang(sglang_source, tokenizer, script)
    gen = SGLangEngineGenerator(engine, lambda ids: tokenizer.decode(ids, skip_special_tokens=False), eos_ids=eos_ids)
    got = generate(gen, [1, 2, 3], params)
    assert (got.finish_reason, got.matched_stop) == (reason, matched)
    assert got == hf_result(tokenizer, eos_ids, script, params)


def test_stop_string_kept_in_text_and_ids_cut_there(tokenizer, eos_ids, sglang_source):
    script = encode(tokenizer, "<search> x y</search>\n<answer> z</answer>")
    gen = SGLangEngineGenerator(SimulatedSGLang(sglang_source, tokenizer, script), tokenizer.decode, eos_ids=eos_ids)
    got = generate(gen, [5], GREEDY)
    assert got.text == "<search> x y</search>" and got.output_ids == encode(tokenizer, "<search> x y</search>")
    assert got.finish_reason == "stop" and got.matched_stop == "</search>"


def test_eos_is_kept_in_ids_and_text(tokenizer, eos_ids, sglang_source):
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in eos_ids  # the tiny model's generation_config lists it (as Qwen2.5-Instruct's does)
    script = encode(tokenizer, "<answer> z</answer>")[:-1] + [im_end, 7, 7]
    gen = SGLangEngineGenerator(SimulatedSGLang(sglang_source, tokenizer, script), tokenizer.decode, eos_ids=eos_ids)
    got = generate(gen, [5], GREEDY.with_updates(stop=["</search>"]))
    assert got.finish_reason == "eos" and got.matched_stop is None
    assert got.output_ids[-1] == im_end and got.text.endswith("<|im_end|>")


def test_excluded_stop_string_is_cut_from_the_text_only(tokenizer, eos_ids, sglang_source):
    script = encode(tokenizer, "<search> x</search> a")
    params = GREEDY.with_updates(include_stop_str_in_output=False)
    gen = SGLangEngineGenerator(SimulatedSGLang(sglang_source, tokenizer, script), tokenizer.decode, eos_ids=eos_ids)
    got = generate(gen, [5], params)
    assert got.text == "<search> x" and got.output_ids == encode(tokenizer, "<search> x</search>")
    assert got == hf_result(tokenizer, eos_ids, script, params)


def test_greedy_and_sampling_params_reach_the_engine(tokenizer, eos_ids, sglang_source):
    engine = SimulatedSGLang(sglang_source, tokenizer, encode(tokenizer, "<answer> z</answer>"))
    gen = SGLangEngineGenerator(engine, tokenizer.decode, eos_ids={2010, 2008})
    generate(gen, [9, 8], SamplingParams(max_new_tokens=32, do_sample=False, temperature=0.7, top_p=0.9, stop=STOPS))
    generate(
        gen,
        [9, 8],
        SamplingParams(max_new_tokens=16, do_sample=True, temperature=0.7, top_p=0.9, top_k=20, stop=["</answer>"]),
    )
    greedy, sampled = engine.calls
    assert greedy["input_ids"] == [9, 8] and greedy["return_logprob"] is False
    assert greedy["sampling_params"] == {
        "max_new_tokens": 32,
        "temperature": 0.0,
        "top_p": 1.0,
        "top_k": -1,
        "repetition_penalty": 1.0,
        "skip_special_tokens": False,
        "stop": STOPS,
        "no_stop_trim": True,
        "stop_token_ids": [2008, 2010],
    }
    assert sampled["sampling_params"] == {
        "max_new_tokens": 16,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "repetition_penalty": 1.0,
        "skip_special_tokens": False,
        "stop": ["</answer>"],
        "no_stop_trim": True,
        "stop_token_ids": [2008, 2010],
    }


def test_logprobs_come_with_the_kept_ids(tokenizer, eos_ids, sglang_source):
    script = encode(tokenizer, "<search> x</search> a b")
    engine = SimulatedSGLang(sglang_source, tokenizer, script)
    gen = SGLangEngineGenerator(engine, tokenizer.decode, eos_ids=eos_ids, return_logprobs=True)
    got = generate(gen, [5], GREEDY)
    assert engine.calls[0]["return_logprob"] is True
    assert got.output_ids == encode(tokenizer, "<search> x</search>")
    assert got.logprobs == [-0.5 - i for i in range(len(got.output_ids))]


def test_abort_and_bad_requests_raise(tokenizer, sglang_source):
    class Aborting(RecordingEngine):
        async def reply(self, arguments):
            return {"output_ids": [], "meta_info": {"finish_reason": {"type": "abort", "message": "too long"}}}

    gen = SGLangEngineGenerator(Aborting(sglang_source), tokenizer.decode)
    with pytest.raises(RuntimeError, match="SGLang aborted the request: too long"):
        generate(gen, [1], GREEDY)
    with pytest.raises(ValueError, match="non-empty prompt"):
        generate(gen, [], GREEDY)


def test_close_shuts_the_engine_down_once(tokenizer, sglang_source):
    engine = SimulatedSGLang(sglang_source, tokenizer, [])
    with SGLangEngineGenerator(engine, tokenizer.decode) as gen:
        pass
    gen.close()
    assert engine.shutdowns == 1
    with pytest.raises(RuntimeError, match="after close"):
        generate(gen, [1], GREEDY)


# ------------------------------------------------------------------ engine arguments and start-up


def eval_cfg(tiny_assets, *extra):
    from rlinf_ext.runner.prepare import load_checked_config

    return load_checked_config(
        "tiny-cpu-eval",
        [
            f"paths.tiny_assets={tiny_assets.root}",
            f"rollout.model.model_path={tiny_assets.qwen2_tiny}",
            "rollout.rollout_backend=sglang",
            "cluster.num_gpus_per_node=8",
            "retrieval.launch=false",
            "tools.search.server_addr=127.0.0.1:1",
            *extra,
        ],
        check_paths=True,
    )


def test_one_engine_per_tp_group_never_sglang_data_parallelism(tiny_assets_registry):
    """Each TP group gets its own engine (dp_size 1, base_gpu_id = its first GPU), as the training worker: SGLang's
    weight updates refuse data-parallel replicas."""
    cfg = eval_cfg(tiny_assets_registry, "rollout.model.precision=bf16", "rollout.gpu_memory_utilization=0.7")
    cfg.cluster.component_placement = {"rollout,reward": "2-7"}  # validated configs: TP divides the rollout GPUs
    cfg.rollout.tensor_parallel_size = 2
    gpus = usable_gpus(cfg, 8)
    assert gpus == [2, 3, 4, 5, 6, 7]
    engines = engine_kwargs(cfg, gpus)
    assert [(k["tp_size"], k["dp_size"], k["base_gpu_id"]) for k in engines] == [(2, 1, 2), (2, 1, 4), (2, 1, 6)]
    assert [k["random_seed"] for k in engines] == [int(cfg.runner.seed) + i for i in range(3)]
    kwargs = engines[0]
    assert kwargs["model_path"] == str(tiny_assets_registry.qwen2_tiny) and kwargs["dtype"] == "bfloat16"
    assert kwargs["mem_fraction_static"] == 0.7 and kwargs["skip_tokenizer_init"] is False
    assert kwargs["load_format"] == "auto"  # evaluation reads the checkpoint (no sync follows)
    with pytest.raises(SGLangUnavailable, match="tensor_parallel_size=2 needs 2 GPU"):
        engine_kwargs(cfg, [0])
    with pytest.raises(SGLangUnavailable, match="not consecutive"):
        engine_kwargs(cfg, [0, 2, 3, 4])
    with pytest.raises(SGLangUnavailable, match="GPUs 2-7, but only 4 CUDA device"):
        usable_gpus(cfg, 4)


def test_all_means_every_gpu_of_the_node(tiny_assets_registry):
    cfg = eval_cfg(tiny_assets_registry)
    cfg.cluster.component_placement = {"rollout,reward": "all"}
    assert usable_gpus(cfg, 8) == list(range(8))
    engines = engine_kwargs(cfg, usable_gpus(cfg, 8))
    assert [k["base_gpu_id"] for k in engines] == list(range(8)) and {k["dp_size"] for k in engines} == {1}


def test_training_engines_start_with_dummy_weights_and_the_memory_saver(tiny_assets_registry):
    from rlinf_ext.generation.sglang_engine import server_kwargs

    cfg = eval_cfg(tiny_assets_registry)
    kwargs = server_kwargs(cfg, tp_size=2, seed=5, load_format="dummy", training=True, memory_saver=True)
    assert kwargs["load_format"] == "dummy" and kwargs["dp_size"] == 1 and kwargs["tp_size"] == 2
    assert kwargs["enable_memory_saver"] is True
    assert server_kwargs(cfg, tp_size=2, seed=5, training=True)["enable_memory_saver"] is False  # disaggregated
    assert kwargs["skip_tokenizer_init"] is (not cfg.rollout.detokenize)


@pytest.mark.slow  # ~5 s: a child process imports sglang's server_args
def test_every_engines_kwargs_build_sglangs_own_server_args(tiny_assets_registry, sglang_source):
    """``Engine(**kwargs)`` builds ``ServerArgs(**kwargs)``: sglang 0.5.23's real class takes the kwargs of the
    evaluation engines, of the training engines (collocated and not) and of vision-language engines, and refuses a
    field it does not have (the check can fail)."""
    from rlinf_ext.generation.sglang_engine import server_kwargs
    from rlinf_ext.generation.sglang_vl import vl_server_overrides

    cfg = eval_cfg(tiny_assets_registry, "rollout.model.precision=bf16")
    built = [
        *engine_kwargs(cfg, [0, 1]),
        server_kwargs(cfg, tp_size=2, seed=5, load_format="dummy", training=True, memory_saver=True),
        server_kwargs(cfg, tp_size=1, seed=5, load_format="dummy", training=True),
        {**server_kwargs(cfg, tp_size=1, seed=5, training=True), **vl_server_overrides("qwen2.5_vl")},
    ]
    wrong = {**built[0], "cuda_graph_max_bs": 8}  # not a field in 0.5.23 (cuda_graph_max_bs_decode is)
    errors = sglang_source.server_args_errors([*built, wrong])
    assert errors[:-1] == [None] * len(built), errors
    assert "cuda_graph_max_bs" in errors[-1] and errors[-1].startswith("TypeError")


def test_from_config_starts_one_engine_per_gpu_with_the_hf_eos_set(tiny_assets_registry, eos_ids, sglang_source):
    started = []

    def factory(**kwargs):
        started.append(kwargs)
        return SimulatedSGLang(sglang_source, None, [])

    gen = SGLangEngineGenerator.from_config(eval_cfg(tiny_assets_registry), gpus=[0, 1], engine_factory=factory)
    assert [(k["base_gpu_id"], k["dp_size"], k["tp_size"]) for k in started] == [(0, 1, 1), (1, 1, 1)]
    assert len(gen.engines) == 2
    assert set(gen.eos_ids) == set(eos_ids)
    assert gen.decode([2003]) == "</search>"


def test_a_failed_start_stops_the_engines_already_started(tiny_assets_registry, sglang_source):
    started = []

    def factory(**kwargs):
        if len(started) == 2:
            raise RuntimeError("CUDA out of memory on GPU 2")
        started.append(SimulatedSGLang(sglang_source, None, []))
        return started[-1]

    with pytest.raises(RuntimeError, match="out of memory"):
        SGLangEngineGenerator.from_config(eval_cfg(tiny_assets_registry), gpus=[0, 1, 2, 3], engine_factory=factory)
    assert [e.shutdowns for e in started] == [1, 1]


class HeldEngine(RecordingEngine):
    """An engine (checked, tests/support/sglang_fakes.py) whose replies wait until the test releases them (to see where
    requests go while others run)."""

    def __init__(self, source, index: int, log: list):
        super().__init__(source)
        self.index, self.log = index, log
        self.release = asyncio.Event()

    async def reply(self, arguments):
        self.log.append((self.index, arguments["input_ids"][0]))
        await self.release.wait()
        return {"text": "x", "output_ids": [7], "meta_info": {"finish_reason": {"type": "stop", "matched": 7}}}

    def shutdown(self, *args, **kwargs):
        super().shutdown(*args, **kwargs)
        if self.index == 0:
            raise RuntimeError("engine 0 did not stop cleanly")


def test_requests_go_to_the_least_busy_engine_and_all_engines_close(tokenizer, sglang_source):
    log: list = []
    engines = [HeldEngine(sglang_source, 0, log), HeldEngine(sglang_source, 1, log)]
    gen = SGLangEngineGenerator(engines, tokenizer.decode, eos_ids=[7])

    async def scenario():
        first = [asyncio.create_task(gen.generate([p], GREEDY)) for p in (10, 11, 12)]
        await asyncio.sleep(0.05)
        assert log == [(0, 10), (1, 11), (0, 12)]  # ties go to the lowest index
        engines[1].release.set()  # engine 1 finishes its request: it is now the less busy one
        await first[1]
        more = [asyncio.create_task(gen.generate([p], GREEDY)) for p in (13, 14)]
        await asyncio.sleep(0.05)
        assert log[3:] == [(1, 13), (1, 14)]  # engine 0 still holds two requests, engine 1 none
        engines[0].release.set()
        return await asyncio.gather(*first, *more)

    results = asyncio.run(scenario())
    assert all(r.finish_reason == "eos" for r in results) and gen.served == [2, 3] and gen.in_flight == [0, 0]
    with pytest.raises(RuntimeError, match="engine 0 did not stop"):
        gen.close()
    assert [e.shutdowns for e in engines] == [1, 1]  # engine 1 stopped although engine 0 failed
    gen.close()
    assert [e.shutdowns for e in engines] == [1, 1]


def test_without_sglang_the_error_names_the_install():
    assert "sglang" not in sys.modules
    with pytest.raises(SGLangUnavailable, match=r"bash scripts/install.sh --sglang"):
        load_engine_class()


@pytest.mark.slow  # ~5 s: a child process imports sglang's server_args
def test_training_engines_of_batches_rolled_out_ahead_schedule_the_lowest_priority_first(sglang_source):
    """k > 0: sglang 0.5.23's priority scheduling, lower values first (each request's batch index); its own
    ``ServerArgs`` takes the keys (and refuses a misspelt one: the check can fail)."""
    from rlinf_ext.config import load_config
    from rlinf_ext.generation.sglang_engine import server_kwargs

    def kwargs(k: int) -> dict:
        cfg = load_config(
            "tiny-cpu",
            ["rollout.rollout_backend=sglang", "rollout.model.precision=bf16", f"runner.max_staleness={k}"],
            strict=False,
        )
        return server_kwargs(cfg, tp_size=1, seed=5, training=True)

    ahead, in_order = kwargs(1), kwargs(0)
    assert ahead["enable_priority_scheduling"] and ahead["schedule_low_priority_values_first"]
    assert "enable_priority_scheduling" not in in_order
    errors = sglang_source.server_args_errors([ahead, {**ahead, "enable_priority_schedule": True}])
    assert errors[0] is None and "enable_priority_schedule" in errors[1]
