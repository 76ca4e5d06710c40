"""QA rows (Search-R1 parquet or RLinf jsonl) -> RLinf jsonl rows `{prompt, solutions, data_source, uid, question}`.

Pure row functions plus a file driver. `uid` is unique across the whole output (GRPO groups by it; Search-R1's
`extra_info.index` restarts per dataset, so it is prefixed by the data source and de-duplicated).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from rlinf_ext.data.prompt_config import PromptConfig, with_tool_instructions
from rlinf_ext.rewards import golden_list


class PreprocessError(ValueError):
    pass


@dataclass
class QARow:
    question: str
    answers: list[str]
    data_source: str
    source_id: str | None


@dataclass
class PreprocessReport:
    read: int = 0
    written: int = 0
    too_long: int = 0
    by_source: Counter = field(default_factory=Counter)
    max_prompt_tokens: int = 0
    total_prompt_tokens: int = 0

    def summary(self, output: Path) -> str:
        mean = self.total_prompt_tokens / self.written if self.written else 0.0
        sources = ", ".join(f"{k}: {v}" for k, v in sorted(self.by_source.items()))
        return (
            f"read {self.read} rows, wrote {self.written} to {output}, dropped {self.too_long} over "
            f"max_prompt_length; prompt tokens mean {mean:.1f} max {self.max_prompt_tokens}; by source: {sources}"
        )


def _plain(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


def question_from_prompt(prompt: Any, marker: str) -> str:
    """The question after the last `marker` in a templated prompt (a string or a list of chat messages)."""
    if isinstance(prompt, list):
        users = [m["content"] for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        prompt = users[-1] if users else ""
    text = str(prompt)
    at = text.rfind(marker)
    if at < 0:
        raise PreprocessError(
            f"no {marker!r} in the prompt, so the question cannot be recovered; add a "
            "'question' field to the rows or set question_marker in the prompt YAML"
        )
    question = text[at + len(marker) :]
    for end in ("<|im_end|>", "\n"):
        question = question.split(end)[0]
    return question.strip()


def parse_row(row: dict, marker: str, default_source: str) -> QARow:
    """Read question / answers / source from either layout."""
    row = {k: _plain(v) for k, v in row.items()}
    if row.get("question"):
        question = str(row["question"]).strip()
    elif "prompt" in row:
        question = question_from_prompt(row["prompt"], marker)
    else:
        raise PreprocessError("row has neither 'question' nor 'prompt'")
    if "golden_answers" in row:
        answers = golden_list(row["golden_answers"])
    elif "solutions" in row:
        answers = golden_list(row["solutions"])
    elif isinstance(row.get("reward_model"), dict) and "ground_truth" in row["reward_model"]:
        answers = golden_list(_plain(row["reward_model"]["ground_truth"]))
    else:
        raise PreprocessError("row has no answers ('golden_answers', 'solutions' or reward_model.ground_truth)")
    if not answers:
        raise PreprocessError("row has an empty answer list")
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
    source_id = row.get("uid") or row.get("id") or extra.get("index")
    return QARow(
        question=question,
        answers=answers,
        data_source=str(row.get("data_source") or default_source),
        source_id=None if source_id is None else str(source_id),
    )


def build_user_message(question: str, cfg: PromptConfig) -> str:
    question = question.strip()
    if cfg.append_question_mark and not question.endswith("?"):
        question += "?"
    return cfg.template.replace("{question}", question)


def build_prompt(question: str, cfg: PromptConfig, tokenizer: Any) -> str:
    user = build_user_message(question, cfg)
    if not cfg.apply_chat_template:
        return user
    messages = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
    messages.append({"role": "user", "content": user})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def read_rows(path: Path) -> Iterator[dict]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        yield from pq.read_table(path).to_pylist()
    elif path.suffix in (".jsonl", ".json"):
        with open(path) as f:
            for n, line in enumerate(f, start=1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise PreprocessError(f"{path}:{n}: not valid JSON ({exc})") from None
    else:
        raise PreprocessError(
            f"{path}: unsupported input type {path.suffix!r}; use .parquet (Search-R1) or .jsonl (RLinf)"
        )


def preprocess_files(
    inputs: list[Path], output: Path, cfg: PromptConfig, tokenizer: Any, show_progress: bool = True
) -> PreprocessReport:
    from tqdm import tqdm

    cfg = with_tool_instructions(cfg)
    report = PreprocessReport()
    used: set[str] = set()
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_suffix(output.suffix + ".tmp")
    with open(tmp, "w") as out:
        for path in inputs:
            if not path.exists():
                raise PreprocessError(f"input file {path} does not exist")
            for n, raw in enumerate(tqdm(read_rows(path), desc=path.name, disable=not show_progress)):
                report.read += 1
                try:
                    qa = parse_row(raw, cfg.question_marker, default_source=path.stem)
                except PreprocessError as exc:
                    raise PreprocessError(f"{path} row {n}: {exc}") from None
                prompt = build_prompt(qa.question, cfg, tokenizer)
                length = len(tokenizer.encode(prompt, add_special_tokens=False))
                if length > cfg.max_prompt_length:
                    report.too_long += 1
                    continue
                uid = unique_uid(qa, path, n, used)
                out.write(
                    json.dumps(
                        {
                            "prompt": prompt,
                            "solutions": qa.answers,
                            "data_source": qa.data_source,
                            "uid": uid,
                            "question": qa.question,
                        },
                        ensure_ascii=False,
                    )
                    + "\n"
                )
                report.written += 1
                report.by_source[qa.data_source] += 1
                report.max_prompt_tokens = max(report.max_prompt_tokens, length)
                report.total_prompt_tokens += length
    tmp.replace(output)
    return report


def unique_uid(qa: QARow, path: Path, row: int, used: set[str]) -> str:
    """`<data_source>-<id>` (id = the row's uid/id/extra_info.index, else file+row); suffixed if taken."""
    base = f"{qa.data_source}-{qa.source_id}" if qa.source_id is not None else f"{qa.data_source}-{path.stem}-{row}"
    if not base.startswith(qa.data_source):  # keep the source prefix even for existing uids
        base = f"{qa.data_source}-{base}"
    uid, k = base, 1
    while uid in used:
        uid, k = f"{base}#{k}", k + 1
    used.add(uid)
    return uid
