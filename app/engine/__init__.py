"""The EAGLE-2 engine. Imports neither gradio nor plotly: its only output is step records.

Public surface:
    TreeConfig, SamplingConfig        validated settings (config.py)
    StepEvent, DraftTreeRecord, RunSummary   the records of DESIGN.md section 3 (events.py)
    Engine                            the decoding loop (engine.py)
    load_target, load_draft_head      model loading (loading.py)
"""
from app.engine.config import METHODS, SamplingConfig, TreeConfig, GenerationLimits
from app.engine.events import DraftTreeRecord, RunSummary, StepEvent

__all__ = [
    "METHODS", "SamplingConfig", "TreeConfig", "GenerationLimits",
    "DraftTreeRecord", "RunSummary", "StepEvent",
]
