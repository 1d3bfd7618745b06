"""Words on the page: the header, "What am I looking at?", the "How it works" panel, the
guided tour's steps and the example prompts."""
from __future__ import annotations

from app.engine.drafters.registry import METHODS
from app.viz.verify_view import kv_caption, mask_caption, tree_caption

TREE_SIZE_LINK = "#tree-size"   # a link the page's script turns into "open the tab Tree size for this machine"
TOUR_LINK = "#tour"             # ... and into "start the guided tour"

WHAT_IS_THIS = (
    "A language model writes one token (a word piece) per pass through the whole model. Here a tiny "
    "**draft head** first guesses a small **tree** of possible next tokens (left: each dot is a guess, "
    "coloured by how sure the head was). The big **target** model then checks every guess in **one "
    "pass** (the *Attention mask* tab shows how one pass can check many branches at once). The longest "
    "branch the target agrees with is kept, plus one token of the target's own (the **bonus**), so a "
    "step can write several tokens for the price of one pass. The answer is exactly what the target "
    "alone would write: wrong guesses only cost a little compute (the *KV cache* tab shows they leave no "
    "trace in memory). Drag the **step slider** (or press ▶) to walk through a run step by step.")


# what the eager fallback costs EAGLE, measured (benchmarks/README.md, "The eager fallback")
EAGER_NOTE = "it needs a C compiler: a Space gets one from packages.txt"


def header_markdown(model: dict | None, tree: dict | None, sized_here: bool, head_missing: str = "") -> str:
    """The page's header in a visitor's words: which model answers, on what, what the draft
    head is, and the default tree and why (linking the tab that shows the measurement).

    ``model``: {"target", "head", "device", "dtype"} and optionally "forward"
    (``app.engine.forward.describe``), or None (a replay-only server);
    ``tree``: the default tree's {"total_tokens", "depth", "top_k"}; ``sized_here``: whether
    it was measured fastest on this machine (``autotune``) or is the engine's fixed default."""
    title = "# EAGLE Lens — watch speculative decoding think\n"
    if model is None:
        return title + ("No model is loaded on this server: it replays recorded runs (the demos, or a trace "
                        "you upload), every step exactly as it ran.")
    device = {"cpu": "CPU", "cuda": "GPU", "mps": "Apple GPU"}.get(model.get("device", ""), model.get("device", ""))
    text = f"Answers come from **{model['target']}** on this server's {device} ({model['dtype']}). "
    forward = model.get("forward")
    if forward and forward["fast"]:
        text += f"Every target forward runs on {forward['text']}. "
    elif forward and model.get("device") == "cpu":
        text += (f"⚠️ **The fast forward is not running** ({forward['text']}): the target decodes on the eager "
                 f"forward, where a forward over a tree costs much more than one over a single token, so EAGLE "
                 f"gains less here than on a machine with the fast forward ({EAGER_NOTE}). ")
    if head_missing:
        return title + text + "No draft head is loaded, so only plain decoding (method vanilla) and recorded runs work."
    text += ("A small **draft head** (one extra layer trained for it) guesses ahead and the model checks all the "
             "guesses in one pass: the same answer, in fewer passes. ")
    if tree:
        n = tree["total_tokens"]
        shape = f"**{n} guess{'es' if n != 1 else ''}, {tree['depth']} deep** (up to {tree['top_k']} per level)"
        text += (f"Default tree: {shape}, " + ("the size measured fastest here" if sized_here
                                                else "the engine's default, not measured here")
                 + f" ([why]({TREE_SIZE_LINK}))")
        if tree.get("lookup"):
            text += (f", with a **prompt-lookup branch** beside it (up to {tree['lookup']} tokens copied from "
                     "earlier in the text, orange in the tree)")
        text += "."
    return title + text + f" [Take the tour]({TOUR_LINK})."


# The guided tour: (CSS selector of what it points at, the tab to open first or "", title, text).
TOUR_STEPS = (
    ("#tree-plot", "", "1 · Draft",
     "Each step, the small draft head guesses a tree of next tokens. Every dot is one guess, coloured by "
     "how sure the head was of it (its q: dark = a long shot, yellow = sure); its shape says what the target "
     "did with it. Hover a dot to see its numbers."),
    ("#mask-plot", "Attention mask", "2 · Verify in one forward",
     "The target checks every guess in ONE pass. This mask is why that works: each row (a guess) may only "
     "look at the text so far and its own ancestors, never at a sibling, so every branch is read as if it "
     "were the only one. Hover a dot in the tree: its row lights up here."),
    ("#phases", "What happened", "3 · Accept the longest match + a bonus",
     "Walking down from the root, a guess is kept while it is what the target itself would have written. "
     "The first mismatch ends the path, and the target's own token there comes free: the bonus. So one "
     "pass writes accepted guesses + 1 token."),
    ("#kv-plot", "KV cache", "4 · Why the answer is identical",
     "Every kept token is one the target itself chose, so the output is exactly plain decoding's. The "
     "wrong branches cost compute in that one pass, but not memory: their cache slots are dropped, the "
     "accepted path is moved together."),
    ("#step-slider", "", "5 · Your turn",
     "Drag the slider or press ▶ to walk through the run. Type a prompt and press Generate to race it "
     "against plain decoding, pin a run as A and compare another tree against it."),
)

# the papers' speedups, from each method's registry entry
_PAPER = {method: METHODS[method].published.paper_speedup for method in ("static", "dynamic", "dynamic@eagle3")}

HOW_IT_WORKS = f"""
### How EAGLE-2 works — in three phases per step

A language model normally produces **one token per forward pass** of the big *target* model.
Speculative decoding lets a small *draft* make guesses that the target checks all at once.

1. **Draft.** EAGLE's draft is a single small decoder layer (the *head*) that reads the
   target's own hidden *features* and predicts the next feature, then the next token through
   the target's LM head. It grows a **tree** of guesses, level by level. EAGLE-2 makes the
   tree *dynamic*: each node's **confidence** is the product of the draft probabilities `q`
   along its path, and only the most confident nodes are expanded and kept. (The tree plot
   colours each node by its own `q`, how sure the head was at that branch, on a log scale;
   its hover gives the path's confidence.)
2. **Verify.** The target runs **one forward pass over the whole tree**, using an attention
   mask so that every node sees only the prompt and its own ancestors. This gives the
   target's probability `p` for every node at the cost of about one ordinary step.
3. **Accept.** Walking down from the root, a node is kept while the target agrees with it
   (greedy: it is the target's top token; sampling: the speculative-sampling rule, which keeps
   the output distribution *exactly* the target's). The first disagreement ends the path, and
   the target's own token at that point — the **bonus token** — is added for free.

So each step yields **accepted draft tokens + 1 bonus token** for one target forward; the mean
of that count is **τ**. When the draft is cheap and a forward over the tree costs about as much
as a forward over one token (a big model on a GPU), τ ≈ the speedup. A small model on a CPU
bends both: the head's layer and its LM head cost about a tenth of a target forward, and each
row of the tree adds multiply-adds, which a CPU without native bfloat16 feels most (*Tree size
for this machine* shows the measured cost of a forward by its rows). So the race can show a
speedup below 1 even with τ > 1: the race measures, it does not assume. EAGLE-2's key observation,
shown in *Insights → calibration*, is that draft confidence closely tracks the real acceptance
rate, so spending the tree's budget on confident nodes pays.

### Three generations of EAGLE

| | what changed | the papers' speedup | measured here (SmolLM2-135M target, greedy) |
|---|---|---|---|
| **EAGLE** | the draft works on *features*: one decoder layer reads the target's last hidden state and the next token, predicts the next hidden state, and the target's own LM head turns it into tokens; a fixed tree shape | {_PAPER['static']} | static 24-node tree with the shipped head: τ 2.69 on mt_bench |
| **EAGLE-2** | the same head; the tree is *dynamic*: the draft's confidence tracks acceptance, so the most confident nodes are expanded and the best `total_tokens` kept | {_PAPER['dynamic']} | 60/5/10 tree: τ 3.05 on all 80 mt_bench prompts (release 6; release 7, trained on the EAGLE-3 head's data too, is shipped: τ 2.56 against 2.43 over six prompt sets); the 3-node tree 3/2/2 with a prompt-lookup branch, the size a 2-core CPU runs fastest: τ 2.19 and 1.71× plain decoding over six prompt sets |
| **EAGLE-3** | no feature regression: trained on tokens only, with *training-time test* (it learns from its own earlier drafts, as it drafts); it reads low, mid and high target layers fused by one linear layer, and drafts over a smaller vocabulary | {_PAPER['dynamic@eagle3']} | shipped as `eagle3` (`models/eagle3-smollm2-135m-instruct/`), trained here on 7.0M tokens of conversations (12,288 of their prompts written by the target itself, 1,024 tasks over long documents), 50.7M seen over ten runs with a 5-step training-time test: held-out acceptance ahead of the EAGLE-2 head's at every depth (0.735 against 0.685 at depth 1, 0.633 against 0.531 at depth 5); τ 2.79 against 2.56 at 60/5/10 over six prompt sets (release 6 of the EAGLE-2 head: 2.43–2.47), and 1.68–1.69× plain decoding against EAGLE-2's 1.63–1.65× under the adaptive tree in the same runs (the run-8 head on an AMX Xeon; 1.46× against 1.41× under AVX2 emulation; the run-9 head level with it on an AMD EPYC, 1.50–1.55×) |

**Methods here:** `dynamic` (EAGLE-2), `static` (EAGLE-1's fixed tree shape), `chain` (classic
one-guess-per-level speculative decoding with the same head), `threshold` (children only above
confidence thresholds τ_high / τ_low), and `vanilla` (no draft, one token per forward).

**Sampling (temperature > 0):** a tree's children are the draft's top-k guesses, and the target
accepts each with its own probability of that token, trying siblings in turn. A tree one node
wide (`chain`, or `dynamic` with top_k = 1) instead *samples* each
guess from the draft's `q` and accepts it with probability min(1, p/q): when q is close to p
that accepts far more often (here, at temperature 1 over six prompt sets, 0.47 against 0.25 at
depth 1). Both rules keep the output distributed exactly as the target's.

**Speed race:** the same prompt is decoded by vanilla decoding of the same model on the same
machine, interleaved with your run in chunks of 16 tokens (never at the same time, so neither
timing disturbs the other, and a change in the machine's load hits both alike). Both clocks
are the engine's own decoding time after the prompt's prefill. Untick *race against plain
decoding* to skip it.

**Carrying settings to the reference EAGLE code:** `total_tokens` here counts drafted nodes
only; the reference code's `total_token` also counts the root, so its `total_token=N` is
`total_tokens=N-1` here. Its `depth=d` drafts d+1 levels, which is `depth=d+1` here; `top_k`
means the same in both.

**Adapting the tree:** with *adapt the tree while decoding* (method dynamic) the run chooses
each step's tree itself among a few candidates (plain decoding, chains of 1–2 guesses, two
small trees and the tree sized for this machine), by the tokens per second it has measured so
far; the step account says when the tree changes and why. The output does not change, only
the speed.
"""

HOW_IT_WORKS_VIEWS = (
    "### The three views of one step\n\n"
    f"**The draft tree.** {tree_caption()}\n\n"
    f"**The tree attention mask** (tab *Attention mask*). {mask_caption()}\n\n"
    f"**The KV cache** (tab *KV cache*). {kv_caption()}\n\n"
    "**Step numbers.** Step 0 is the *prefill*: one forward over the whole prompt, which fills the cache "
    "and yields the first token; the EAGLE head then reads the prompt's features into its own cache "
    "(no tree yet). Steps 1, 2, … are the decoding steps, each one "
    "draft → verify → accept.")

EXAMPLES = (
    ("chat", "What are three tips for staying focused while studying?"),
    ("code", "Write a Python function that checks whether a string is a palindrome."),
    ("math", "Count from 1 to 20, separated by commas."),   # the model answers it right (a word problem it got wrong)
    ("summary", "Summarize in two sentences: The Industrial Revolution began in Britain in the late "
                "18th century. It brought steam power, factories and railways, and changed how people "
                "lived and worked, moving many from farms to growing cities."),
)
