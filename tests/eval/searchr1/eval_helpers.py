"""Hand-made trajectories for the evaluation tests (no model, no server)."""

from __future__ import annotations

from rlinf_ext.agent.core.types import Trajectory, TurnRecord


def make_trajectory(turn_texts: list[str], searches_ok: list[bool] | None = None, obs_len: int = 3) -> Trajectory:
    """A trajectory whose turns say `turn_texts`; the first len(searches_ok) turns are searches."""
    searches_ok = searches_ok or []
    turns, response_ids, mask = [], [], []
    for i, text in enumerate(turn_texts):
        is_search = i < len(searches_ok)
        gen = [ord(c) % 50 for c in text][:5] or [1]
        obs = list(range(100, 100 + obs_len)) if is_search else []
        turns.append(
            TurnRecord(
                prompt_ids=[1, 2],
                response_ids=gen,
                observation_ids=obs,
                text=text,
                action="search" if is_search else "answer",
                tool="search" if is_search else None,
                tool_ok=searches_ok[i] if is_search else None,
            )
        )
        response_ids += gen + obs
        mask += [1] * len(gen) + [0] * len(obs)
    return Trajectory(
        uid="u",
        prompt_ids=[1, 2],
        response_ids=response_ids,
        response_mask=mask,
        turns=turns,
        response_text="".join(turn_texts),
        answers=None,
    )


def decode_stub(ids: list[int]) -> str:
    return "<information>" + " ".join(map(str, ids)) + "</information>"
