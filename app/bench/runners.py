"""One timed generation per (method, prompt), measured the same way for every method.

What "tokens/s" means here (the same for every row of the table): decoding speed after the
prompt is in the cache, i.e. prefill excluded.

* Engine methods (vanilla and the tree policies): the prefill (step 0) reads the whole prompt
  and yields the first new token, as ``generate``'s does; ``RunSummary.seconds`` is the sum
  of the step times after it, and only the tokens of those steps are counted.
* ``hf`` / ``hf-pld`` (transformers ``generate``): a streamer timestamps every batch of
  tokens ``generate`` emits. Its first batch comes out of the prefill forward (for hf-pld
  the prefill also verifies the first lookup), so we time from that first batch to the
  last and count only the tokens emitted after the first batch:
  tokens/s = (n - n_first) / (t_last - t_first). Both sides thus measure "n forwards'
  worth of decoding, divided into the tokens those forwards produced".
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from app.engine.config import SamplingConfig, TreeConfig, TreeShape
from app.engine.spec import HEAD_METHODS, METHODS

# hf-fp32 / hf-bf16: plain generate on a float32 / bfloat16 copy of the target (the engine's
# own target when it has that dtype), so one run reports its ratio to plain decoding in both.
# hf-compile: transformers' own fast path, as a power user would try it: a static KV cache
# and ``torch.compile(model.forward)`` (default mode), on a copy in the engine's dtype;
# compiled during the bench's warm-up, not timed.
HF_METHODS = ("hf", "hf-pld", "hf-fp32", "hf-bf16", "hf-compile")
PEER_METHODS = ("hf-fp32", "hf-bf16", "hf-compile")       # run on a target of their own
STATIC_CACHE_LEN = 2048                                     # hf-compile: one cache shape, one decode graph
ALL_METHODS = HF_METHODS + METHODS
PLD_TOKENS = 10   # prompt_lookup_num_tokens for hf-pld (transformers' documented example value)


@dataclass(frozen=True)
class MethodSpec:
    """One column of the benchmark: a method and its tree.

    ``label`` is what the user wrote: ``dynamic``, ``dynamic:60/5/10`` (total_tokens/depth/top_k,
    the papers' notation) or ``dynamic:auto`` (the hardware-aware tree of app.engine.autotune).
    """

    label: str
    method: str                       # one of HF_METHODS or spec.METHODS
    tree: TreeConfig | None = None    # None for hf methods
    auto: bool = False
    adaptive: bool = False            # dynamic:adaptive: the tree adapts while decoding (app.engine.adapt)
    lookup: int | None = None         # +lookupN: a prompt-lookup branch of N tokens (None: --lookup, else
                                      # none for a fixed tree and auto_lookup for the adaptive one)
    candidates: tuple = ()            # ... between these trees
    prior_tau: dict | None = None
    head: str | None = None           # "@HEAD" of the label: another EAGLE head (folder or shipped name)

    @property
    def is_hf(self) -> bool:
        return self.method in HF_METHODS

    @property
    def uses_head(self) -> bool:
        """Whether the EAGLE head drafts (pld, lookahead and medusa need none)."""
        return self.tree is not None and self.tree.uses_head

    @property
    def uses_medusa(self) -> bool:
        return self.tree is not None and self.tree.method == "medusa"


def parse_methods(spec: str, base: TreeConfig) -> list[MethodSpec]:
    """``"hf,vanilla,dynamic,dynamic:60/5/10,dynamic:auto"`` -> specs (tree knobs from ``base``)."""
    out: list[MethodSpec] = []
    for label in [s.strip() for s in spec.split(",") if s.strip()]:
        body, at, head = label.partition("@")
        body, plus, lookup = body.partition("+lookup")
        name, _, variant = body.partition(":")
        if plus and (not lookup.isdigit() or name not in HEAD_METHODS):
            raise ValueError(f"only the EAGLE head's methods take +lookupN (a prompt-lookup branch of up to N "
                             f"tokens, e.g. dynamic:4/2/2+lookup3), got {label!r}")
        if at and (not head or name not in HEAD_METHODS):
            raise ValueError(f"only the EAGLE head's methods take @HEAD (a head folder or a shipped head's name), "
                             f"got {label!r}")
        if name not in ALL_METHODS:
            raise ValueError(f"methods must be among {', '.join(ALL_METHODS)} (optionally name:TOTAL/DEPTH/TOP_K "
                             f"or name:auto or dynamic:adaptive), got {label!r}")
        if name in HF_METHODS:
            if variant:
                raise ValueError(f"method {name} takes no tree variant, got {label!r}")
            out.append(MethodSpec(label, name))
            continue
        knobs = {**base.__dict__, "method": name}
        if plus:
            knobs["lookup"] = int(lookup)
        tree, auto = TreeConfig(**knobs), False
        adaptive = False
        if variant in ("auto", "adaptive"):
            if name != "dynamic":
                raise ValueError(f"only dynamic has an auto or adaptive tree, got {label!r}")
            auto, adaptive = variant == "auto", variant == "adaptive"
        elif variant:
            try:
                shape = TreeShape.parse(variant)
            except ValueError:
                raise ValueError(f"a method variant is TOTAL/DEPTH/TOP_K (e.g. dynamic:60/5/10), got {label!r}") from None
            tree = shape.config(name, base=tree)
        out.append(MethodSpec(label, name, tree, auto, adaptive, head=head or None,
                              lookup=int(lookup) if plus else None))
    if not out:
        raise ValueError("methods must name at least one method")
    if len({m.label for m in out}) != len(out):
        raise ValueError(f"methods must not repeat, got {spec!r}")
    return out


@dataclass
class RunRecord:
    """One (method, prompt) generation: what the report aggregates. Times in ms."""

    suite: str
    question_id: int | str
    method: str                       # the spec's label
    new_tokens: int                   # all tokens generated
    timed_tokens: int                 # tokens produced inside the timed window
    seconds: float                    # the timed window
    forwards: int                     # target forwards inside the timed window
    draft_ms: float = 0.0             # engine methods: summed over steps
    verify_ms: float = 0.0
    step_ms: float = 0.0
    depth_reached: list[int] = field(default_factory=list)   # steps whose verification reached depth d
    depth_accepted: list[int] = field(default_factory=list)  # ... and accepted a token at depth d
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    tree: dict | None = None          # the tree settings used (engine methods)
    tree_steps: dict[str, list[int]] = field(default_factory=dict)   # "N/d/k" or "vanilla": [steps, tokens]
    threads: int = 0                  # CPU threads it ran on (0: not recorded)
    prefill_ms: float = 0.0           # reading the prompt up to the first token (outside the timed window)

    @property
    def tokens_per_s(self) -> float:
        return self.timed_tokens / self.seconds if self.seconds > 0 else 0.0


def _sampling_kwargs(sampling: SamplingConfig) -> dict:
    if sampling.greedy:
        return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    return {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p,
            "top_k": sampling.top_k_sampling}   # 0 = no top-k, as in our SamplingConfig


class _Clock:
    """A transformers streamer that only timestamps: (perf_counter, tokens) per ``put``."""

    def __init__(self, device: torch.device):
        self.device = device
        self.marks: list[tuple[float, int]] = []
        self.ids: list[int] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        now = time.perf_counter()      # generate has already copied the tokens to the host
        if not self._prompt_seen:      # the first put is the prompt itself
            self._prompt_seen = True
            return
        ids = value.reshape(-1).tolist()
        self.marks.append((now, len(ids)))
        self.ids.extend(int(t) for t in ids)

    def end(self) -> None:
        pass


@torch.inference_mode()
def run_hf(target, spec: MethodSpec, suite: str, qid, prompt_ids: list[int], sampling: SamplingConfig,
           max_new_tokens: int) -> RunRecord:
    """transformers ``generate`` (plain, or prompt-lookup decoding for hf-pld) on the same model."""
    model, device = target.model, target.device
    ids = torch.tensor([prompt_ids], device=device)
    clock = _Clock(device)
    kwargs = _sampling_kwargs(sampling)
    if spec.method == "hf-pld":
        kwargs["prompt_lookup_num_tokens"] = PLD_TOKENS
    if not sampling.greedy:
        torch.manual_seed(sampling.seed)
    static = getattr(target, "static_cache", None)          # hf-compile's peer (``compiled_peer``)
    if static is not None:
        static.reset()
        kwargs["cache"] = static
    eos = sorted(target.eos_ids)
    start = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, streamer=clock,
                   eos_token_id=eos or None, pad_token_id=target.tokenizer.pad_token_id if
                   target.tokenizer.pad_token_id is not None else (eos[0] if eos else 0), **kwargs)
    marks = clock.marks
    n_first = marks[0][1] if marks else 0
    seconds = marks[-1][0] - marks[0][0] if len(marks) > 1 else 0.0
    token_ids = clock.ids[:max_new_tokens]
    return RunRecord(suite=suite, question_id=qid, method=spec.label, new_tokens=len(token_ids),
                     timed_tokens=len(clock.ids) - n_first, seconds=seconds, forwards=max(0, len(marks) - 1),
                     prefill_ms=(marks[0][0] - start) * 1e3 if marks else 0.0, token_ids=token_ids,
                     text=target.tokenizer.decode(token_ids, skip_special_tokens=True))


def run_engine(engine, spec: MethodSpec, suite: str, qid, prompt_ids: list[int], sampling: SamplingConfig,
               max_new_tokens: int) -> RunRecord:
    """One ``Engine.generate``; totals and acceptance counts from its step records."""
    draft = verify = step = 0.0
    timed = 0                         # tokens of the decoding steps (the prefill's first token is untimed)
    reached: list[int] = []
    accepted: list[int] = []
    tree_steps: dict[str, list[int]] = {}   # which trees the steps ran (an adaptive run moves between them)
    summary = None
    prefill_ms = 0.0
    adapter = None
    if spec.adaptive:
        # lazy: adapt imports transformers, which `bench --help` (it imports this module) never loads
        from app.engine.adapt import TreeAdapter

        adapter = TreeAdapter(list(spec.candidates), prior_tau=spec.prior_tau)
    for event in engine.generate(prompt_ids=prompt_ids, tree=spec.tree, sampling=sampling,
                                 max_new_tokens=max_new_tokens, adapt=adapter):
        if event.type == "summary":
            summary = event
            continue
        if event.prefill:               # the target's prompt forward, and the head's read of the prompt
            prefill_ms = event.step_ms
            continue
        timed += len(event.new_tokens)
        steps_tokens = tree_steps.setdefault(TreeShape.key(event.tree_config), [0, 0])
        steps_tokens[0] += 1
        steps_tokens[1] += len(event.new_tokens)
        draft += event.draft_ms
        verify += event.verify_ms
        step += event.step_ms
        if event.tree is not None and len(event.tree):
            # same rule as events.acceptance_by_depth, kept as counts so prompts add up exactly
            k = len(event.accepted)
            for d in range(1, min(max(event.tree.depths), k + 1) + 1):
                while len(reached) < d:
                    reached.append(0)
                    accepted.append(0)
                reached[d - 1] += 1
                accepted[d - 1] += int(k >= d)
    t = spec.tree
    return RunRecord(suite=suite, question_id=qid, method=spec.label, new_tokens=summary.new_tokens,
                     timed_tokens=timed, seconds=summary.seconds, forwards=summary.target_forwards,
                     draft_ms=draft, verify_ms=verify, step_ms=step, prefill_ms=prefill_ms, depth_reached=reached,
                     depth_accepted=accepted, token_ids=list(summary.token_ids), text=summary.text,
                     tree=t.shape() if t.uses_draft else None, tree_steps=tree_steps)


def compiled_peer(target):
    """hf-compile's target: a copy of ``target`` whose forward is ``torch.compile``d and which
    decodes into one ``StaticCache`` (transformers' documented fast path for ``generate``)."""
    import copy
    from dataclasses import replace

    from transformers import StaticCache    # lazy: `bench --help` imports this module without transformers

    model = copy.deepcopy(target.model)
    model.forward = torch.compile(model.forward)
    peer = replace(target, model=model)
    peer.static_cache = StaticCache(config=model.config, max_cache_len=STATIC_CACHE_LEN)
    return peer


def run_one(engine, spec: MethodSpec, suite: str, qid, prompt_ids, sampling, max_new_tokens,
            peers: dict | None = None) -> RunRecord:
    """``peers``: the targets of PEER_METHODS, by method (``hf-fp32`` defaults to the engine's)."""
    if spec.method in PEER_METHODS:
        return run_hf((peers or {}).get(spec.method, engine.target), spec, suite, qid, prompt_ids, sampling,
                      max_new_tokens)
    if spec.is_hf:
        return run_hf(engine.target, spec, suite, qid, prompt_ids, sampling, max_new_tokens)
    return run_engine(engine, spec, suite, qid, prompt_ids, sampling, max_new_tokens)
