"""`python -m app bench`: speed of every decoding method on the EAGLE papers' prompt sets.

prompts.py   the evaluation sets shipped in data/eval (first user turn of each question)
runners.py   one generation per (method, prompt), timed the same way for every method
report.py    aggregation, the markdown table, the JSON document
plots.py     plotly figures (speedup by suite, acceptance by depth) as one HTML file
cli.py       arguments, warm-up, the interleaved loop, the progress bar
"""
