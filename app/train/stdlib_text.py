"""Given text for the training prompts: prose and small functions from the Python standard
library itself (PSF licence, shipped with every Python).

The summarise / rewrite / extract / explain-this-code prompts of ``app/train/prompts.py``
need a passage or a function to work on. Taking them from the standard library's own
docstrings and source keeps the prompt set buildable offline, with a licence that allows it,
and from text no evaluation set is drawn from. The selection is deterministic for a given
Python (sorted module and attribute names), so the prompt set is reproducible on it.
"""
from __future__ import annotations

import inspect
import re


_STDLIB_MODULES = [
    "argparse", "asyncio", "bisect", "calendar", "collections", "contextlib", "csv", "dataclasses",
    "datetime", "decimal", "difflib", "email", "enum", "fractions", "functools", "gettext", "heapq",
    "html", "http.client", "imaplib", "inspect", "ipaddress", "itertools", "json", "logging",
    "mailbox", "mimetypes", "operator", "optparse", "pathlib", "pickle", "pprint", "queue",
    "random", "re", "sched", "secrets", "shlex", "shutil", "smtplib", "socket", "statistics",
    "string", "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize", "turtle",
    "typing", "unittest", "urllib.parse", "uuid", "wave", "weakref", "zipfile", "zoneinfo",
]


def stdlib_passages(min_chars: int = 250, max_chars: int = 900) -> list[str]:
    """Prose paragraphs from docstrings of standard-library modules, classes and functions."""
    import importlib

    out: list[str] = []
    seen: set[str] = set()
    for name in _STDLIB_MODULES:
        try:
            mod = importlib.import_module(name)
        except Exception:  # a module missing from a slim Python build is simply skipped
            continue
        objs = [mod] + [getattr(mod, a) for a in sorted(dir(mod)) if not a.startswith("_")]
        for obj in objs:
            doc = inspect.getdoc(obj) if (inspect.ismodule(obj) or inspect.isclass(obj)
                                          or inspect.isfunction(obj)) else None
            if not doc:
                continue
            for para in re.split(r"\n\s*\n", doc):
                flat = " ".join(para.split())
                # prose only: no doctest lines, tables or option lists
                if not (min_chars <= len(flat) <= max_chars) or ">>>" in para or "|" in para \
                        or flat.count("  ") or para.lstrip().startswith(("-", "*", ":")):
                    continue
                if flat not in seen:
                    seen.add(flat)
                    out.append(flat)
    return out


def stdlib_functions(min_lines: int = 6, max_lines: int = 30) -> list[str]:
    """Short pure-Python function sources from the standard library, docstrings removed."""
    import importlib

    out: list[str] = []
    for name in _STDLIB_MODULES:
        try:
            mod = importlib.import_module(name)
        except Exception:
            continue
        for attr in sorted(dir(mod)):
            fn = getattr(mod, attr)
            if not inspect.isfunction(fn) or getattr(fn, "__module__", None) != mod.__name__:
                continue
            try:
                src = inspect.getsource(fn)
            except (OSError, TypeError):
                continue
            src = re.sub(r'^(\s+)("""|\'\'\')[\s\S]*?\2\n', "", src, count=1, flags=re.M)
            n = src.count("\n")
            if min_lines <= n <= max_lines:
                out.append(inspect.cleandoc("\n" + src) if src.startswith(" ") else src.rstrip())
    return out
