"""`python -m app generate|tune|bench|train|export-head ...` — one entry point, one module per subcommand.

Each subcommand module exposes ``add_arguments(parser)`` and ``main(args) -> int`` (the exit
status). Modules are imported only when their subcommand runs, so `generate` never pays for
gradio or plotly.
"""
from __future__ import annotations

import argparse
import importlib
import sys

SUBCOMMANDS = {
    "generate": ("app.cli", "decode one prompt with the EAGLE engine (or vanilla), print text or JSON lines"),
    "tune": ("app.tune", "measure this machine's profile for the auto tree once (kept on disk)"),
    "bench": ("app.bench.cli", "benchmark methods on the evaluation prompt sets"),
    "train": ("app.train.cli", "build data and train an EAGLE draft head for a target model"),
    "export-head": ("app.export_head", "write an EAGLE head in vLLM's speculators layout, or back in the EAGLE layout"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m app", description="EAGLE Lens command line")
    sub = parser.add_subparsers(dest="command", required=True)
    name = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    for cmd, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(cmd, help=help_text, description=help_text)
        if cmd == name:  # only the chosen subcommand's module is imported
            importlib.import_module(module).add_arguments(p)
    args = parser.parse_args(argv)
    return importlib.import_module(SUBCOMMANDS[args.command][0]).main(args)


if __name__ == "__main__":
    sys.exit(main())
