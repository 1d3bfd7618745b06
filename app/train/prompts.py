"""Training prompts for self-distillation: topics × task templates, disjoint from the eval sets.

EAGLE trains its head on the *target's own* answers (self-distillation) to a broad set of user
turns; the head only has to predict what the target will say, so the prompts matter for their
variety, not for their answers. Here every prompt is built offline from:

* hand-written topic lists (``prompt_words.py``) and the task templates below, one generator
  per category, combined by a seeded ``torch.Generator``: a first generation (chat, writing,
  explanation, code, math word problems, factual QA, translation; prompts 0-8,191) and,
  appended after it, a second (role-play, extraction from made-up reviews, people and sales
  records, STEM processes and misconceptions, humanities essays and debates, small reasoning
  puzzles);
* passages and functions from the Python standard library's own docstrings and source code
  (``stdlib_text.py``; PSF licence, shipped with every Python) as the "given text" for
  summarise / rewrite / explain-this-code tasks.

None of it is taken from an evaluation set, and ``build_prompts`` drops any prompt that is an
exact or near duplicate (normalised word n-gram Jaccard or containment) of any turn of any set
in ``data/eval`` (``eval_overlap.EvalIndex``); a test checks the result again.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from app.train.eval_overlap import EVAL_DIR, EvalIndex, normalise
from app.train.prompt_words import (
    ACTIVITIES, ADJECTIVES, ANIMALS, ARTS, AUDIENCES, CITIES, CLASSES, CODE_TASKS, CONCEPTS, COUNTERFACTUALS,
    COUNTRIES, DAYS, DEBATES, ELEMENTS, FAULTS, FORMS, HISTORY_EVENTS, HUMAN_LANGUAGES, IDEAS, ITEMS, JOBS,
    LANGUAGES_CODE, MISCONCEPTIONS, MONTHS, NAMES, PAIRS, PEOPLE, PERSONAS, PRAISES, PRODUCTS, QUANTITIES,
    ROLE_TASKS, SENTENCE_PREDICATES, SENTENCE_SUBJECTS, STEM_PROCESSES, TONES, TOPICS)
from app.train.stdlib_text import stdlib_functions, stdlib_passages


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str


def pick(seq, g: torch.Generator):
    """One element of `seq`, drawn from the seeded generator `g` (same seed, same prompts)."""
    return seq[int(torch.randint(len(seq), (1,), generator=g))]


def draw_int(lo: int, hi: int, g: torch.Generator) -> int:
    """An integer in [lo, hi], both ends included, drawn from the seeded generator `g`."""
    return int(torch.randint(lo, hi + 1, (1,), generator=g))


# --- the generators, one per category -----------------------------------------------------

def _chat(g):
    t = pick([
        "What are some good tips for {a}?", "I'm finding {a} hard. Can you help me get started?",
        "Give me a simple weekly plan for {a}.", "What mistakes do people often make when {a}?",
        "My friend is interested in {a}. What advice would you give them?",
        "Can you suggest five small habits that help with {a}?",
        "How do I stay motivated when {a}?", "Is {a} a good idea for a beginner? Why or why not?",
    ], g)
    return t.format(a=pick(ACTIVITIES, g))


def _writing(g):
    t = pick([
        "Write {f} about {t}.", "Write {f} about {t} in a {tone} tone.",
        "Please write {f} that mentions {t}.", "Compose {f} inspired by {t}.",
        "Write a {tone} opening paragraph for a story about {t}.",
        "Write {f} for children about {t}.", "Create a title and a short blurb for a book about {t}.",
    ], g)
    return t.format(f=pick(FORMS, g), t=pick(TOPICS, g), tone=pick(TONES, g))


def _explain(g):
    kind = draw_int(0, 4, g)
    if kind == 0:
        a, b = pick(PAIRS, g)
        return pick(["What is the difference between {a} and {b}?", "How are {a} and {b} different?",
                      "Compare {a} and {b} in a few sentences."], g).format(a=a, b=b)
    c = pick(CONCEPTS, g)
    return pick(["Explain {c} in simple terms.", "How does {c} work?", "Explain {c} to {aud}.",
                  "Why is {c} important?", "Give me an everyday example of {c}.",
                  "What is {c}? Keep it short.", "Describe {c} step by step."], g
                 ).format(c=c, aud=pick(AUDIENCES, g))


def _code(g, functions):
    kind = draw_int(0, 3, g)
    if kind <= 1:
        return pick(["Write a {l} function that {t}.", "In {l}, how would I write code that {t}?",
                      "Show me a {l} program that {t}, with a short explanation.",
                      "Write a {l} function that {t} and add a few test cases."], g
                     ).format(l=pick(LANGUAGES_CODE, g), t=pick(CODE_TASKS, g))
    src = pick(functions, g)
    return pick(["Explain what this Python function does:\n\n{s}",
                  "Add comments to this Python code:\n\n{s}",
                  "Can this function be simplified? Explain.\n\n{s}",
                  "Describe the inputs and outputs of this function:\n\n{s}"], g).format(s=src)


def _math(g):
    n1, n2 = pick(NAMES, g), pick(NAMES, g)
    item, price = pick(ITEMS, g)
    a, b, c = draw_int(2, 40, g), draw_int(2, 25, g), draw_int(2, 9, g)
    t = pick([
        "{n1} buys {a} {item} at ${p} each and pays with a ${big} note. How much change does {n1} get?",
        "{n1} has {a} {item}. {n2} gives {n1} {b} more, and then {n1} shares them equally among {c} friends. "
        "How many does each friend get, and how many are left over?",
        "A train travels at {a}0 km per hour for {c} hours and then at {b}0 km per hour for 2 hours. How far does it go in total?",
        "A garden is {a} metres long and {b} metres wide. What is its area and its perimeter?",
        "{n1} reads {b} pages a day. The book has {a}0 pages. How many days will it take to finish the book?",
        "A shop sells {item} for ${p}. During a sale the price drops by {c}0 percent. What does {a} of them cost in the sale?",
        "{n1} is {b} years old. {n2} is {c} times as old as {n1}. How old will {n2} be in {a} years?",
        "A tank holds {a}0 litres and fills at {c} litres per minute. How long does it take to fill half of it?",
        "{n1} saves ${b} each week. How many weeks does it take to save ${a}0, and what is saved after that many weeks?",
        "A recipe needs {c} eggs for {b} pancakes. How many eggs are needed for {a} pancakes?",
        "Solve for x: {c}x + {a} = {b}{c}. Show your steps.",
        "What is {a} percent of {b}0? Explain how you calculate it.",
    ], g)
    return t.format(n1=n1, n2=n2 if n2 != n1 else "Jo", item=item, p=price, a=a, b=b, c=c,
                    big=int(a * price) + draw_int(1, 20, g))


def _factual(g):
    return pick([
        "Tell me about the geography of {co}.", "What is {co} known for?", "What languages are spoken in {co}?",
        "Describe a traditional dish from {co}.", "Who was {p} and why are they remembered?",
        "What were the main achievements of {p}?", "What is {e} used for?", "Where is {e} found in nature?",
        "How do {an} communicate?", "What do {an} eat, and where do they live?",
        "Give me three interesting facts about {t}.", "What is the history of {t}?",
    ], g).format(co=pick(COUNTRIES, g), p=pick(PEOPLE, g), e=pick(ELEMENTS, g),
                 an=pick(ANIMALS, g), t=pick(TOPICS, g))


def _given_text(g, passages):
    p = pick(passages, g)
    return pick([
        "Summarise the following text in two sentences:\n\n{p}", "Give a one-line summary of this paragraph:\n\n{p}",
        "Rewrite the following paragraph in plain, simple language:\n\n{p}",
        "List the key points of this text as bullet points:\n\n{p}",
        "Rewrite this text so that it sounds friendlier:\n\n{p}",
        "Read this passage and write three questions about it:\n\n{p}",
        "Shorten this text to about half its length:\n\n{p}",
    ], g).format(p=p)


def _translate(g):
    s = f"{pick(SENTENCE_SUBJECTS, g)} {pick(SENTENCE_PREDICATES, g)}."
    lang = pick(HUMAN_LANGUAGES, g)
    return pick(["Translate into {l}: \"{s}\"", "How do you say \"{s}\" in {l}?",
                  "Translate the following sentence to {l} and explain any tricky words: {s}"], g
                 ).format(l=lang, s=s)


# --- second generation (prompts 8,192 onwards): the mt_bench categories the head found hardest

def _roleplay(g):
    persona = pick(PERSONAS, g)
    task = pick(ROLE_TASKS, g).format(a=pick(ACTIVITIES, g), t=pick(TOPICS, g))
    return pick([
        "Pretend you are {p}. {T}.", "Act as {p} and {task}.", "You are {p}. Stay in character and {task}.",
        "Imagine you are {p}. In your own voice, {task}.", "Play the role of {p}: {task}.",
        "I'd like you to speak as {p} would. Please {task}.",
        "From now on you are {p}. A visitor asks you about {t}. What do you say?",
        "Take on the persona of {p} and write a short monologue about {t}.",
    ], g).format(p=persona, task=task, T=task[0].upper() + task[1:], t=pick(TOPICS, g))


def _synthetic_text(g) -> tuple[str, str]:
    """A short made-up document and what kind it is: reviews, people, or sales records."""
    kind = draw_int(0, 2, g)
    k = draw_int(3, 5, g)
    if kind == 0:
        lines = []
        for i in range(k):
            # "The <product>": the product's first word (its article, or for "wireless headphones"
            # an adjective) is dropped; kept as is because shards 128+ were answered with it
            good = draw_int(0, 1, g)
            lines.append(f"Review {i + 1} ({pick(NAMES, g)}): The {pick(PRODUCTS, g).split(' ', 1)[-1]} "
                         f"{pick(PRAISES if good else FAULTS, g)}, and it {pick(FAULTS if good else PRAISES, g)}.")
        return "\n".join(lines), "reviews"
    if kind == 1:
        lines = [f"{pick(NAMES, g)} is a {draw_int(22, 68, g)}-year-old {pick(JOBS, g)} who moved to "
                 f"{pick(CITIES, g)} in {draw_int(1990, 2023, g)}." for _ in range(k)]
        return " ".join(lines), "people"
    lines = [f"On {draw_int(1, 28, g)} {pick(MONTHS, g)}, {pick(NAMES, g)} sold {draw_int(2, 90, g)} {pick(ITEMS, g)[0]} "
             f"in {pick(CITIES, g)} for ${draw_int(5, 900, g)}." for _ in range(k)]
    return " ".join(lines), "sales"


def _extraction(g, passages):
    if draw_int(0, 3, g) == 0:   # structure from real prose
        return pick([
            "Read the text below and return a JSON object with the keys \"topic\", \"keywords\" (a list of "
            "five) and \"summary\" (one sentence).\n\n{p}",
            "List every technical term in this passage with a short definition of each, as a table.\n\n{p}",
            "From the following text, extract all instructions or rules it gives, numbered.\n\n{p}",
            "Identify the main claim of this paragraph and the evidence for it. Answer in two labelled lines.\n\n{p}",
        ], g).format(p=pick(passages, g))
    text, kind = _synthetic_text(g)
    asks = {
        "reviews": ["Rate each review from 1 (negative) to 5 (positive) and return a JSON list of numbers.",
                    "For each review, extract the reviewer's name, the product and one positive and one negative point. Answer in JSON.",
                    "Which reviews are mostly positive and which mostly negative? Return a table with two columns."],
        "people": ["Extract each person's name, age, job and city, and return them as a CSV table with a header row.",
                   "Return a JSON array with one object per person (keys: name, age, job, city, year).",
                   "Who has lived longest in their current city? List everyone sorted by the year they moved."],
        "sales": ["Extract every sale as a JSON object with the keys date, seller, quantity, item, city and price.",
                  "Make a markdown table of these sales and add a final row with the total revenue.",
                  "Which city had the highest total sales in dollars? Show the figures you used."],
    }[kind]
    return f"{pick(asks, g)}\n\n{text}"


def _stem(g):
    return pick([
        "Describe the process of {x} and explain why it matters.", "What are the main stages of {x}?",
        "Explain the science behind {x}, including any key equations.", "Explain {x} and give a real-world application.",
        "What would happen if {cf}? Think it through scientifically.",
        "A student claims that {m}. Is this correct? Explain.", "How do scientists measure {q}?",
        "Design a simple experiment a school could run to demonstrate {x}.",
        "Explain {x} to {aud}, then give the precise scientific version.",
        "What are the most common misunderstandings about {x}?",
    ], g).format(x=pick(STEM_PROCESSES, g), cf=pick(COUNTERFACTUALS, g), m=pick(MISCONCEPTIONS, g),
                 q=pick(QUANTITIES, g), aud=pick(AUDIENCES, g))


def _humanities(g):
    i1, i2 = pick(IDEAS, g), pick(IDEAS, g)
    return pick([
        "Discuss the causes and consequences of {e}.", "What lessons can we learn today from {e}?",
        "How did {e} change everyday life for ordinary people?", "Explain the main ideas of {i} and one criticism of it.",
        "Present the arguments for and against {d}.", "Write a short, balanced essay on {d}.",
        "Compare {i} with {i2}.", "How did {a} influence later culture?",
        "What can {i} tell us about a modern problem such as {d}?", "Explain {i} using an example from {e}.",
        "Outline an economist's view of {d}.", "Why do historians still argue about {e}?",
    ], g).format(e=pick(HISTORY_EVENTS, g), i=i1, i2=i2 if i2 != i1 else "pragmatism",
                 d=pick(DEBATES, g), a=pick(ARTS, g))


def _reasoning(g):
    kind = draw_int(0, 5, g)
    names = []
    while len(names) < 4:  # four distinct names
        n = pick(NAMES, g)
        if n not in names:
            names.append(n)
    a, b, c, d = names
    if kind == 0:
        more, least = pick(ADJECTIVES, g)
        return (f"{a} is {more} than {b}. {c} is {more} than {a}, and {b} is {more} than {d}. "
                f"Who is the {least}, and how do you know?")
    if kind == 1:
        x, y, z = pick(CLASSES, g)
        return pick([f"All {x} are {y}. Some {y} are {z}. Does it follow that some {x} are {z}? Explain.",
                      f"If every one of the {x} is one of the {y}, and no {y} are {z}, can any {x} be {z}? Why?"], g)
    if kind == 2:
        day, n = pick(DAYS, g), draw_int(3, 400, g)
        return pick([f"If today is {day}, what day of the week will it be in {n} days? Show the reasoning.",
                      f"A meeting happens every {draw_int(2, 9, g)} days, starting on a {day}. "
                      f"On which day of the week is meeting number {draw_int(3, 12, g)}?"], g)
    if kind == 3:
        start, step = draw_int(1, 9, g), draw_int(2, 7, g)
        seq = [start + step * i for i in range(5)] if draw_int(0, 1, g) else [start * step ** i for i in range(5)]
        return f"What number comes next in the sequence {', '.join(map(str, seq))}? Explain the rule."
    if kind == 4:
        r, bl = draw_int(2, 9, g), draw_int(2, 9, g)
        return pick([f"A bag holds {r} red and {bl} blue marbles. If you draw two without looking, what is the "
                      "chance that both are red?",
                      f"{a} rolls two dice. What is the probability that the total is {draw_int(3, 11, g)}? Explain."], g)
    return pick([f"{a} is {b}'s mother and {c} is {a}'s father. How is {c} related to {b}?",
                  f"{a} always tells the truth and {b} always lies. {b} says \"{a} took the last biscuit\". "
                  f"Did {a} take it? Explain.",
                  f"{a}, {b} and {c} each own a different pet: a cat, a dog or a fish. {a} is allergic to fur and "
                  f"{b} does not own the dog. Who owns which pet?"], g)


# (category, weight) of each generation. A prompt set only ever grows by appending, so the
# feature shards already on disk (64 prompts each, by index) stay valid when it grows: the
# first generation makes prompts 0 .. FIRST_GENERATION - 1 exactly as it did for releases 1-4,
# the second everything after, with its own seeded generator.
CATEGORIES = [("chat", 3), ("writing", 3), ("explanation", 3), ("code", 2), ("math", 2),
              ("factual", 2), ("given_text", 2), ("translation", 1)]
FIRST_GENERATION = 8192
CATEGORIES_2 = [("roleplay", 3), ("extraction", 3), ("stem", 3), ("humanities", 3), ("reasoning", 2),
                ("writing", 1), ("code", 1), ("math", 1), ("given_text", 1)]


def build_prompts(n: int, seed: int = 0, first_generation: int = FIRST_GENERATION) -> list[Prompt]:
    """``n`` distinct prompts, reproducible from ``seed``, eval-overlapping ones removed.

    ``build_prompts(m)`` is a prefix of ``build_prompts(n)`` for every m < n.
    """
    passages, functions = stdlib_passages(), stdlib_functions()
    makers = {
        "chat": _chat, "writing": _writing, "explanation": _explain, "math": _math, "factual": _factual,
        "translation": _translate, "code": lambda g: _code(g, functions),
        "given_text": lambda g: _given_text(g, passages),
        "roleplay": _roleplay, "extraction": lambda g: _extraction(g, passages), "stem": _stem,
        "humanities": _humanities, "reasoning": _reasoning,
    }
    eval_index = EvalIndex.from_dir(EVAL_DIR)
    seen: set[str] = set()
    out: list[Prompt] = []
    for categories, end, gen_seed in ((CATEGORIES, min(n, first_generation), seed),
                                      (CATEGORIES_2, n, seed + 1_000_003)):
        g = torch.Generator().manual_seed(gen_seed)
        weights = torch.tensor([w for _, w in categories], dtype=torch.float)
        attempts = 0
        while len(out) < end:
            attempts += 1
            if attempts > 50 * n + 1000:
                raise RuntimeError(f"could only build {len(out)} distinct prompts of the {n} asked for")
            cat = categories[int(torch.multinomial(weights, 1, generator=g))][0]
            text = makers[cat](g)
            key = normalise(text)
            if key in seen or eval_index.overlaps(text):
                continue
            seen.add(key)
            out.append(Prompt(id=f"p{len(out):06d}", category=cat, text=text))
    return out


def save_prompts(prompts: list[Prompt], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(p.__dict__) + "\n" for p in prompts))
    tmp.rename(path)


def load_prompts(path: Path) -> list[Prompt]:
    return [Prompt(**json.loads(line)) for line in Path(path).read_text().splitlines() if line.strip()]
