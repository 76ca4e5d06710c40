"""Helpers of the MM loop tests: a scripted VL generator over the real tiny VL tokenizer, settings, tools."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlinf_ext.agent.mmsearch.loop import LoopSettings, SearchTools
from rlinf_ext.config.schema import ImageSearchToolConfig
from rlinf_ext.tools.config import SearchToolConfig
from rlinf_ext.tools.image_search import ImageSearch
from rlinf_ext.tools.search import SearchTool
from tests.support.scripted import ScriptedGenerator

PX = 56 * 56


@dataclass
class ScriptedVLGenerator(ScriptedGenerator):
    """ScriptedGenerator that also takes `images` (recorded per call), like a VL engine."""

    images_seen: list = field(default_factory=list)

    async def generate(self, prompt_ids, sampling_params, images=None):
        self.images_seen.append(list(images or []))
        return await super().generate(prompt_ids, sampling_params)


def settings(**kw) -> LoopSettings:
    base = dict(
        max_gen_round=3, image_search_limit=1, text_search_limit=1, response_length_total=2048, max_obs_length=200
    )
    base.update(kw)
    return LoopSettings(**base)


def tools(cache_dir, topk: int = 3, text_topk: int = 2) -> SearchTools:
    image = ImageSearch(
        ImageSearchToolConfig(
            backend="cache_dir", cache_path=str(cache_dir), topk=topk, thumbnail_min_pixels=PX, thumbnail_max_pixels=PX
        )
    )
    text = SearchTool(SearchToolConfig(backend="dummy", topk=text_topk))
    return SearchTools(image, text)
