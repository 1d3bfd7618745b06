"""Pictures of step records: pure functions from ``StepEvent`` / ``RunSummary`` to plotly
figures or HTML strings. No Gradio, no model: every function here can be tested (and reused in
a notebook) with records alone."""
