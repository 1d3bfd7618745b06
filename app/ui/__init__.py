"""The Gradio teaching app.

    settings.py   what the *server* decides (models, caps, queue) — read from the environment,
                  never from the page
    requests.py   turn raw widget / API values into validated engine settings
    session.py    one visitor's state (their runs, their cached vanilla race, step mode)
    traces.py     save a run as JSON; load and *validate* a trace from anyone
    handlers/     plain Python generators: settings in, dicts of named view updates out; one
                  module per feature (run, replay, demos, explorer, ab), shared parts in common
    blocks/       the Gradio page: components (layout), each feature's events, the queue
"""
