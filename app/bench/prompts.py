"""The evaluation prompt sets in data/eval (see data/eval/README.md for origin and licence).

Each line is ``{"question_id", "category", "turns": [...], ...}``; like Spec-Bench and the
EAGLE papers we use the first turn as the single user message.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

EVAL_DIR = Path(__file__).resolve().parents[2] / "data" / "eval"


@dataclass(frozen=True)
class Prompt:
    suite: str
    question_id: int | str
    category: str
    text: str


def available_suites(folder: Path | None = None) -> list[str]:
    return sorted(p.stem for p in (folder or EVAL_DIR).glob("*.jsonl"))


def parse_suites(spec: str, folder: Path | None = None) -> list[str]:
    """``"mt_bench,gsm8k"`` or ``"all"`` -> suite names; unknown names raise ValueError."""
    known = available_suites(folder)
    names = known if spec.strip() == "all" else [s.strip() for s in spec.split(",") if s.strip()]
    if not names:
        raise ValueError(f"suite must name at least one of: all, {', '.join(known)}")
    for name in names:
        if name not in known:
            raise ValueError(f"suite must be 'all' or among {', '.join(known)}, got {name!r}")
    return names


def load_suite(name: str, limit: int | None = None, folder: Path | None = None) -> list[Prompt]:
    """The first ``limit`` questions of a suite (all with None), in file order."""
    out = []
    with open((folder or EVAL_DIR) / f"{name}.jsonl", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            out.append(Prompt(suite=name, question_id=row.get("question_id", len(out)),
                              category=row.get("category", name), text=row["turns"][0]))
            if limit is not None and len(out) >= limit:
                break
    return out
