"""Where a generated turn ends and why: the one rule every engine's reply follows (pure, no torch).

A turn ends at its first token that is an EOS id (``eos``), else completes a stop string (``stop``), else is
the last one ``max_new_tokens`` allows (``length``); that token is kept in the ids. The text is the decoded
ids, minus the matched stop string when ``include_stop_str_in_output`` is off (the ids keep it).

Engines differ in what they already decided, told by ``engine_reason``:
- ``None``: nothing (HF ``generate`` pads rows that ended early and runs to the batch's largest budget), so
  every token up to the budget is checked.
- ``"eos"`` / ``"stop"`` (with ``engine_stop``): the engine stopped there itself (vLLM, SGLang); kept as it is.
- ``"length"``: the engine ran to the budget; only the last token is checked again (vLLM checks stop strings
  after the budget), so a turn whose last allowed token is EOS or completes a stop string ends as
  ``eos``/``stop`` on every engine.

What the serving engines share (pure, unit-tested): ``engine_sampling`` turns our ``SamplingParams`` and the
EOS set into the sampling terms both engines take (each engine module only renames them), and
``engine_finish`` reads the finish reason both report the same way (``stop`` with the matched string = a stop
string, ``stop`` with a token id or nothing = EOS, ``length`` = the budget).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from rlinf_ext.protocol.generation import FinishReason, SamplingParams

# extra tokens decoded before the stop-string window: a token decodes to >= 1 character (special ones aside),
# so `longest stop + 4` tokens cover any stop string the last of them completes
_TAIL_SLACK = 4


@dataclass(frozen=True)
class TurnEnd:
    output_ids: list[int]
    text: str
    finish_reason: FinishReason
    matched_stop: str | None


def stop_completed_at(
    ids: Sequence[int], n: int, stop: Sequence[str], decode: Callable[[list[int]], str]
) -> str | None:
    """The stop string found in the decoded tail ending at token ``n`` (1-based), else None. Several found: the
    one whose last occurrence starts first."""
    longest = max((len(s) for s in stop), default=0)
    if not longest or n < 1:
        return None
    tail = decode(list(ids[max(0, n - longest - _TAIL_SLACK) : n]))
    hits = [s for s in stop if s in tail]
    return min(hits, key=tail.rfind) if hits else None


def turn_end(
    ids: Sequence[int],
    decode: Callable[[list[int]], str],
    *,
    eos_ids: Collection[int],
    stop: Sequence[str],
    max_new_tokens: int,
    include_stop_str_in_output: bool = True,
    engine_reason: FinishReason | None = None,
    engine_stop: str | None = None,
    text: str | None = None,
) -> TurnEnd:
    """The turn's ids, text, finish reason and matched stop string (see the module docstring).

    ``ids``: the sampled ids as the engine returned them; ``text``: the engine's own decoding of exactly those
    ids, if it made one (otherwise, and whenever the ids are cut, ``decode`` makes it).
    """
    ids = [int(t) for t in ids]
    if engine_reason in ("eos", "stop"):
        end, reason, matched = len(ids), engine_reason, engine_stop if engine_reason == "stop" else None
    else:
        budget = min(len(ids), int(max_new_tokens))
        first = 0 if engine_reason is None else max(budget - 1, 0)
        end, reason, matched = budget, "length", None
        for n in range(first + 1, budget + 1):
            if ids[n - 1] in eos_ids:
                end, reason = n, "eos"
                break
            found = stop_completed_at(ids, n, stop, decode)
            if found is not None:
                end, reason, matched = n, "stop", found
                break
    kept = ids[:end]
    out_text = text if text is not None and end == len(ids) else decode(kept)
    if matched is not None and not include_stop_str_in_output and matched in out_text:
        out_text = out_text[: out_text.rfind(matched)]
    return TurnEnd(kept, out_text, reason, matched)


# ------------------------------------------------------------------------------------------ shared by the engines
@dataclass(frozen=True)
class EngineSampling:
    """One request's sampling in the terms vLLM and SGLang share (their own names are the engine modules')."""

    max_new_tokens: int
    temperature: float  # 0.0 = greedy (both engines then take the arg-max)
    top_p: float  # 1.0 = off
    top_k: int  # 0 = off
    repetition_penalty: float
    stop: list[str]  # stop strings: the engine keeps them in the ids and the text (turn_end cuts the text)
    stop_token_ids: list[int]  # the HF EOS set, so every engine ends a turn on the same ids


def engine_sampling(params: SamplingParams, eos_ids: Iterable[int]) -> EngineSampling:
    """Our ``SamplingParams`` + EOS ids -> ``EngineSampling`` (pure). Greedy (``do_sample`` off or temperature
    <= 0) = temperature 0 with top-p/top-k off; top-k <= 0 = off."""
    greedy = not params.do_sample or params.temperature <= 0
    return EngineSampling(
        max_new_tokens=int(params.max_new_tokens),
        temperature=0.0 if greedy else float(params.temperature),
        top_p=1.0 if greedy else float(params.top_p),
        top_k=0 if greedy or not params.top_k or params.top_k < 0 else int(params.top_k),
        repetition_penalty=float(params.repetition_penalty),
        stop=list(params.stop),
        stop_token_ids=sorted({int(i) for i in eos_ids}),
    )


def engine_finish(kind: str | None, matched: int | str | None, engine: str) -> tuple[FinishReason, str | None]:
    """An engine's finish reason -> ``turn_end``'s ``engine_reason``/``engine_stop`` (pure): ``stop`` with a string
    = that stop string, ``stop`` with a token id or None = EOS, ``length`` = the budget; anything else (an abort)
    raises, naming ``engine``."""
    if kind == "stop":
        return ("stop", matched) if isinstance(matched, str) else ("eos", None)
    if kind == "length":
        return "length", None
    raise RuntimeError(f"{engine} ended the request with finish reason {kind!r} ({matched!r})")
