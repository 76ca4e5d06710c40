"""Path checks (``validate --check-paths``): every file and directory the run reads exists."""

from __future__ import annotations

from pathlib import Path

from rlinf_ext.config.schema import REQUIRED, ExperimentConfig
from rlinf_ext.config.structure import ConfigIssue


def path_issues(cfg: ExperimentConfig) -> list[ConfigIssue]:
    """Existence of every path the run reads (only with check_paths=True)."""
    checks: list[tuple[str, object, str]] = [("rollout.model.model_path", cfg.rollout.model.model_path, "dir")]
    checks += [(f"data.train_data_paths[{i}]", p, "file") for i, p in enumerate(_as_list(cfg.data.train_data_paths))]
    checks += [(f"data.val_data_paths[{i}]", p, "file") for i, p in enumerate(_as_list(cfg.data.val_data_paths))]
    if cfg.retrieval.launch:
        checks.append(("retrieval.corpus_path", cfg.retrieval.corpus_path, "file"))
        if cfg.retrieval.pages_path is not None:
            checks.append(("retrieval.pages_path", cfg.retrieval.pages_path, "file"))
        if cfg.retrieval.retriever != "bm25":
            checks.append(("retrieval.model_path", cfg.retrieval.model_path, "dir"))
    if cfg.runner.resume_dir not in (None, "auto"):
        checks.append(("runner.resume_dir", cfg.runner.resume_dir, "dir"))
    issues = []
    for key, value, kind in checks:
        if value is None or value == REQUIRED:
            continue
        p = Path(str(value))
        ok = p.is_dir() if kind == "dir" else p.is_file()
        if not ok:
            what = "directory" if kind == "dir" else "file"
            issues.append(
                ConfigIssue(
                    key, f"{what} {p} does not exist.", f"create it or point {key.split('[')[0]} at an existing {what}."
                )
            )
    return issues


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]
