"""Words on the page: the "How EAGLE-2 works" panel and the example prompts."""
from __future__ import annotations

HOW_IT_WORKS = """
### How EAGLE-2 works — in three phases per step

A language model normally produces **one token per forward pass** of the big *target* model.
Speculative decoding lets a small *draft* make guesses that the target checks all at once.

1. **Draft.** EAGLE's draft is a single small decoder layer (the *head*) that reads the
   target's own hidden *features* and predicts the next feature, then the next token through
   the target's LM head. It grows a **tree** of guesses, level by level. EAGLE-2 makes the
   tree *dynamic*: each node's **confidence** is the product of the draft probabilities `q`
   along its path, and only the most confident nodes are expanded and kept. (Colour of each
   node in the tree plot.)
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
breaks both assumptions — the head costs a sizeable share of the target, and 25 tokens cost
several times one — so there the race can show a speedup below 1 even with τ > 1: the race
measures, it does not assume. EAGLE-2's key observation,
shown in *Insights → calibration*, is that draft confidence closely tracks the real acceptance
rate, so spending the tree's budget on confident nodes pays.

**Methods here:** `dynamic` (EAGLE-2), `static` (EAGLE-1's fixed tree shape), `chain` (classic
one-guess-per-level speculative decoding with the same head), `threshold` (children only above
confidence thresholds τ_high / τ_low), and `vanilla` (no draft, one token per forward).

**Sampling (temperature > 0):** a tree's children are the draft's top-k guesses, and the target
accepts each with its own probability of that token, trying siblings in turn. A tree one node
wide (`chain`, or `dynamic` with top_k = 1, the size a small CPU affords) instead *samples* each
guess from the draft's `q` and accepts it with probability min(1, p/q): when q is close to p
that accepts far more often (here, at temperature 1 over six prompt sets, 0.47 against 0.25 at
depth 1). Both rules keep the output distributed exactly as the target's.

**Speed race:** after your run the same prompt is decoded by vanilla decoding of the same model
on the same machine — one after the other, never at the same time, so neither timing is
disturbed. Both clocks are the engine's own decoding time after the prompt's prefill.
"""

EXAMPLES = (
    ("chat", "What are three tips for staying focused while studying?"),
    ("code", "Write a Python function that checks whether a string is a palindrome."),
    ("math", "A train travels 60 km in 45 minutes. What is its average speed in km/h? Explain step by step."),
    ("summary", "Summarize in two sentences: The Industrial Revolution began in Britain in the late "
                "18th century. It brought steam power, factories and railways, and changed how people "
                "lived and worked, moving many from farms to growing cities."),
)
