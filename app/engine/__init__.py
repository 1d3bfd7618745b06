"""The EAGLE-2 engine. Imports neither gradio nor plotly: its only output is step records.

This package exports only what loads without torch (the settings and the step records), so
the page's plots can import it cheaply; import the engine itself from its module
(``from app.engine.factory import load_engine``, ``from app.engine.engine import Engine``).

Exported here:
    METHODS                                                 the method names (spec.py)
    TreeConfig, SamplingConfig, GenerationLimits            validated settings (config.py)
    StepEvent, DraftTreeRecord, RunSummary                  the step records (events.py)

Modules:
    spec.py         every knob of a request, once (``SPEC``: ``Setting``, ``SETTINGS``, ``KNOB``), the method names
    config.py       the config classes that hold a request's values and check them against ``SPEC``
    events.py       the step records: the only thing that crosses from the engine to its consumers
    engine.py       ``Engine``: the decoding loop (prefill, draft, verify, accept, commit)
    run_state.py    what a generation carries between its verbs (``_Run``, ``_Verified``, ``PhaseClock``)
    head_draft.py   the EAGLE head's side of the draft verb (``read_pending``, ``HeadDrafting``)
    draft_model.py  what the head drafts with (``DraftModel``: its forward, embeddings, LM head), chosen once
    record.py       the record verb's arithmetic: each node's status and target probability p
    factory.py      ``load_engine``: target + draft head + draft vocabulary + Medusa heads
    loading.py      loading the target model (embedded or from the hub) and the heads' folders
    sources.py      where models come from, by name alone (no torch): the CLI's checks before loading
    device.py       ``cache_dir`` and ``choose_device``
    heads/          the draft heads and their checkpoints: ``load_head`` (either EAGLE kind, either
                    layout) and a head's draft vocabulary (``__init__.py``), the shared checkpoint I/O
                    (``checkpoint.py``), EAGLE-1/2 (``eagle.py``), EAGLE-3 (``eagle3.py``), vLLM's
                    speculators layout (``speculators.py``), Medusa's heads (``medusa.py``)
    drafters/       the drafters that are not an EAGLE head (registry, prompt lookup, lookahead, Medusa)
    tree.py         draft-tree policies as pure functions: draft scores in, tree out
    verify.py       which drafted tokens the target accepts (greedy and exact sampled rules)
    kv.py           the only code that touches KV-cache internals
    fused.py        the target's decoder stack for decode and verify steps (eager, fused projections)
    rowwise.py, kernels/   the fast batch-invariant CPU forward and its C kernels
    precision.py    float32 or bfloat16: the faster, chosen by measuring
    threads.py      how many CPU threads a forward should use now
    autotune.py     the tree size this machine verifies fastest per token (T(n), tau(d, N), the choice)
    adapt.py        moving between candidate trees while decoding, by measured tokens/s
"""
from app.engine.config import GenerationLimits, SamplingConfig, TreeConfig
from app.engine.events import DraftTreeRecord, RunSummary, StepEvent
from app.engine.spec import METHODS

__all__ = [
    "METHODS", "SamplingConfig", "TreeConfig", "GenerationLimits",
    "DraftTreeRecord", "RunSummary", "StepEvent",
]
