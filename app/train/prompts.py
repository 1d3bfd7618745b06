"""Training prompts for self-distillation: topics × task templates, disjoint from the eval sets.

EAGLE trains its head on the *target's own* answers (self-distillation) to a broad set of user
turns; the head only has to predict what the target will say, so the prompts matter for their
variety, not for their answers. Here every prompt is built offline from:

* hand-written topic lists and task templates (chat, writing, explanation, code, math word
  problems, factual QA, translation), combined by a seeded ``torch.Generator``;
* passages and functions from the Python standard library's own docstrings and source code
  (PSF licence, shipped with every Python) as the "given text" for summarise / rewrite /
  explain-this-code tasks.

None of it is taken from an evaluation set, and ``filter_overlapping`` drops any prompt that
is an exact or near duplicate (normalised word n-gram Jaccard or containment) of any turn of
any set in ``data/eval`` (copied from shared/data/eval); a test checks the result again.
"""
from __future__ import annotations

import inspect
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from app.engine.loading import REPO_ROOT

EVAL_DIR = REPO_ROOT / "data" / "eval"   # the evaluation sets, copied into the repo with attribution


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str


# --- building blocks ---------------------------------------------------------------------

TOPICS = [
    "volcanoes", "honeybees", "the printing press", "coral reefs", "the water cycle", "black holes",
    "the Roman aqueducts", "electric cars", "sourdough bread", "chess openings", "the human heart",
    "rainforests", "solar panels", "the Silk Road", "octopuses", "glaciers", "jazz music",
    "the immune system", "lighthouses", "origami", "the moon landing", "compost", "tea ceremonies",
    "submarines", "desert plants", "the stock market", "bicycles", "earthquakes", "penguins",
    "ancient Egypt", "vaccines", "wind turbines", "libraries", "coffee", "the Internet",
    "mushrooms", "public transport", "the Renaissance", "photosynthesis", "recycling",
    "sleep", "dinosaurs", "the Olympic Games", "tides", "medieval castles", "birdsong",
    "3D printing", "the periodic table", "marathon running", "city parks", "rivers",
    "hot air balloons", "the violin", "tornadoes", "bees and pollination", "minimalism",
    "board games", "the Great Wall", "antibiotics", "street food", "autumn leaves",
    "space stations", "dolphins", "clocks and timekeeping", "the postal service",
    "handwriting", "cheese making", "thunderstorms", "the night sky", "urban gardening",
    "robots in factories", "the Arctic", "kites", "museums", "snowflakes", "trains",
    "pottery", "the human brain", "bridges", "fireflies", "the Amazon river", "nutrition",
    "old maps", "wolves", "quantum computers", "volunteering", "a village bakery",
    "mountain hiking", "friendship", "learning a new language", "remote work",
    "the first day at a new school", "a rainy afternoon", "an old family recipe",
    "a lost umbrella", "moving to a new city", "a small bookshop", "a winter morning",
]

ACTIVITIES = [
    "learning to play the guitar", "starting a vegetable garden", "running a first 5k race",
    "keeping a houseplant alive", "saving money each month", "preparing for a job interview",
    "cooking for a large family", "studying for exams", "training a puppy", "staying focused while working from home",
    "making new friends as an adult", "reducing screen time", "organising a small closet",
    "planning a birthday party", "writing a first novel", "learning to swim", "painting with watercolours",
    "keeping a journal", "getting better sleep", "speaking in public", "baking bread at home",
    "travelling on a tight budget", "learning to code", "decluttering a garage", "hosting a board game night",
    "caring for an elderly parent", "starting a small online shop", "camping for the first time",
]

CONCEPTS = [
    "inflation", "gravity", "recursion", "supply and demand", "machine learning", "photosynthesis",
    "the greenhouse effect", "compound interest", "natural selection", "electric current",
    "the blockchain", "a binary search", "democracy", "plate tectonics", "the placebo effect",
    "encryption", "a hash table", "opportunity cost", "entropy", "the speed of light",
    "vaccination", "a neural network", "the water table", "photosynthesis in algae", "DNA replication",
    "the Doppler effect", "a recession", "object-oriented programming", "the scientific method",
    "a web browser", "nuclear fusion", "the carbon cycle", "a credit score", "sound waves",
    "magnetism", "an operating system", "the food chain", "jet engines", "a database index",
    "version control", "rainbows", "the seasons", "a mortgage", "antibiotic resistance",
]

PAIRS = [
    ("weather", "climate"), ("a virus", "a bacterium"), ("a list", "a tuple in Python"),
    ("speed", "velocity"), ("RAM", "hard disk storage"), ("an alligator", "a crocodile"),
    ("stocks", "bonds"), ("a comet", "an asteroid"), ("baking soda", "baking powder"),
    ("a simile", "a metaphor"), ("HTTP", "HTTPS"), ("a lake", "a pond"), ("mass", "weight"),
    ("a compiler", "an interpreter"), ("a republic", "a monarchy"), ("tea", "coffee"),
    ("a hurricane", "a typhoon"), ("frogs", "toads"), ("a loan", "a grant"), ("AC", "DC electricity"),
]

AUDIENCES = ["a ten-year-old", "a busy manager", "a high-school student", "my grandmother",
             "a complete beginner", "a university student", "someone who has never used a computer"]

FORMS = ["a short poem", "a haiku", "a limerick", "a short story", "a diary entry", "a friendly letter",
         "a product description", "a short speech", "a song chorus", "a dialogue between two friends",
         "an advertisement", "a motivational note", "a fairy tale", "a news headline and first paragraph",
         "a recipe introduction", "a postcard message", "a riddle"]

TONES = ["cheerful", "mysterious", "formal", "humorous", "calm", "dramatic", "nostalgic", "hopeful"]

CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "counts the vowels in a sentence", "removes duplicates from a list while keeping order",
    "finds the largest number in a list", "converts Celsius to Fahrenheit", "checks whether a word is a palindrome",
    "merges two sorted lists", "computes the factorial of a number", "counts how often each word appears in a text",
    "flattens a nested list", "returns the second smallest element of a list", "capitalises every word in a string",
    "computes the average of a list of numbers", "checks whether two strings are anagrams",
    "sums the digits of an integer", "finds the common elements of two lists", "reads a CSV file and prints each row",
    "sorts a list of dictionaries by a key", "validates a simple email address", "rotates a list by k positions",
    "converts a Roman numeral to an integer", "computes the greatest common divisor of two numbers",
    "generates all subsets of a small set", "transposes a matrix given as a list of lists",
    "implements a stack with push and pop", "counts the lines in a text file", "implements bubble sort",
    "checks whether parentheses in a string are balanced", "converts a binary string to an integer",
    "returns the longest word in a sentence", "implements binary search on a sorted list",
]
LANGUAGES_CODE = ["Python", "Python", "Python", "JavaScript", "C", "Java", "Rust", "Go", "Bash"]

HUMAN_LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese", "Dutch"]

SENTENCE_SUBJECTS = ["My brother", "The old teacher", "Our neighbours", "The little cat", "My best friend",
                     "The train", "The children", "This restaurant", "The museum", "My grandmother"]
SENTENCE_PREDICATES = ["opens at nine in the morning", "likes to read books in the garden",
                       "is going to the market tomorrow", "arrived late because of the rain",
                       "cooks soup every Sunday", "lives near the river", "forgot the keys at home",
                       "wants to learn how to dance", "visited the mountains last summer",
                       "is very happy today", "needs a new pair of shoes", "sings in a small choir"]

COUNTRIES = ["Portugal", "Kenya", "Japan", "Chile", "Norway", "Vietnam", "Morocco", "Canada",
             "New Zealand", "Peru", "Finland", "Egypt", "Thailand", "Argentina", "Ireland", "Nepal",
             "Ghana", "Iceland", "Mexico", "Poland", "Indonesia", "Greece", "Colombia", "Sweden"]
PEOPLE = ["Marie Curie", "Leonardo da Vinci", "Ada Lovelace", "Isaac Newton", "Nelson Mandela",
          "Frida Kahlo", "Galileo Galilei", "Charles Darwin", "Jane Austen", "Nikola Tesla",
          "Mahatma Gandhi", "Wolfgang Amadeus Mozart", "Rosalind Franklin", "Alan Turing",
          "Florence Nightingale", "Johannes Gutenberg", "Cleopatra", "Confucius"]
ELEMENTS = ["iron", "copper", "helium", "silicon", "gold", "oxygen", "aluminium", "lithium", "carbon", "neon"]
ANIMALS = ["elephants", "owls", "sharks", "bats", "camels", "ants", "whales", "parrots", "foxes", "turtles"]

NAMES = ["Lena", "Omar", "Priya", "Tom", "Ana", "Kwame", "Mei", "Lucas", "Sara", "Ivan", "Noor", "Ben"]
ITEMS = [("apples", 0.5), ("notebooks", 2), ("pencils", 0.25), ("tickets", 12), ("cupcakes", 3),
         ("stickers", 0.1), ("books", 8), ("bottles of juice", 1.5)]


def _pick(seq, g: torch.Generator):
    return seq[int(torch.randint(len(seq), (1,), generator=g))]


def _int(lo: int, hi: int, g: torch.Generator) -> int:
    return int(torch.randint(lo, hi + 1, (1,), generator=g))


# --- given text from the standard library (PSF licence) ----------------------------------

_STDLIB_MODULES = [
    "argparse", "asyncio", "bisect", "calendar", "collections", "contextlib", "csv", "dataclasses",
    "datetime", "decimal", "difflib", "email", "enum", "fractions", "functools", "gettext", "heapq",
    "html", "http.client", "imaplib", "inspect", "ipaddress", "itertools", "json", "logging",
    "mailbox", "mimetypes", "operator", "optparse", "pathlib", "pickle", "pprint", "queue",
    "random", "re", "sched", "secrets", "shlex", "shutil", "smtplib", "socket", "statistics",
    "string", "tarfile", "tempfile", "textwrap", "threading", "timeit", "tokenize", "turtle",
    "typing", "unittest", "urllib.parse", "uuid", "wave", "weakref", "zipfile", "zoneinfo",
]


def stdlib_passages(min_chars: int = 250, max_chars: int = 900) -> list[str]:
    """Prose paragraphs from docstrings of standard-library modules, classes and functions."""
    import importlib

    out: list[str] = []
    seen: set[str] = set()
    for name in _STDLIB_MODULES:
        try:
            mod = importlib.import_module(name)
        except Exception:  # a module missing from a slim Python build is simply skipped
            continue
        objs = [mod] + [getattr(mod, a) for a in sorted(dir(mod)) if not a.startswith("_")]
        for obj in objs:
            doc = inspect.getdoc(obj) if (inspect.ismodule(obj) or inspect.isclass(obj)
                                          or inspect.isfunction(obj)) else None
            if not doc:
                continue
            for para in re.split(r"\n\s*\n", doc):
                flat = " ".join(para.split())
                # prose only: no doctest lines, tables or option lists
                if not (min_chars <= len(flat) <= max_chars) or ">>>" in para or "|" in para \
                        or flat.count("  ") or para.lstrip().startswith(("-", "*", ":")):
                    continue
                if flat not in seen:
                    seen.add(flat)
                    out.append(flat)
    return out


def stdlib_functions(min_lines: int = 6, max_lines: int = 30) -> list[str]:
    """Short pure-Python function sources from the standard library, docstrings removed."""
    import importlib

    out: list[str] = []
    for name in _STDLIB_MODULES:
        try:
            mod = importlib.import_module(name)
        except Exception:
            continue
        for attr in sorted(dir(mod)):
            fn = getattr(mod, attr)
            if not inspect.isfunction(fn) or getattr(fn, "__module__", None) != mod.__name__:
                continue
            try:
                src = inspect.getsource(fn)
            except (OSError, TypeError):
                continue
            src = re.sub(r'^(\s+)("""|\'\'\')[\s\S]*?\2\n', "", src, count=1, flags=re.M)
            n = src.count("\n")
            if min_lines <= n <= max_lines:
                out.append(inspect.cleandoc("\n" + src) if src.startswith(" ") else src.rstrip())
    return out


# --- the generators, one per category -----------------------------------------------------

def _chat(g):
    t = _pick([
        "What are some good tips for {a}?", "I'm finding {a} hard. Can you help me get started?",
        "Give me a simple weekly plan for {a}.", "What mistakes do people often make when {a}?",
        "My friend is interested in {a}. What advice would you give them?",
        "Can you suggest five small habits that help with {a}?",
        "How do I stay motivated when {a}?", "Is {a} a good idea for a beginner? Why or why not?",
    ], g)
    return t.format(a=_pick(ACTIVITIES, g))


def _writing(g):
    t = _pick([
        "Write {f} about {t}.", "Write {f} about {t} in a {tone} tone.",
        "Please write {f} that mentions {t}.", "Compose {f} inspired by {t}.",
        "Write a {tone} opening paragraph for a story about {t}.",
        "Write {f} for children about {t}.", "Create a title and a short blurb for a book about {t}.",
    ], g)
    return t.format(f=_pick(FORMS, g), t=_pick(TOPICS, g), tone=_pick(TONES, g))


def _explain(g):
    kind = _int(0, 4, g)
    if kind == 0:
        a, b = _pick(PAIRS, g)
        return _pick(["What is the difference between {a} and {b}?", "How are {a} and {b} different?",
                      "Compare {a} and {b} in a few sentences."], g).format(a=a, b=b)
    c = _pick(CONCEPTS, g)
    return _pick(["Explain {c} in simple terms.", "How does {c} work?", "Explain {c} to {aud}.",
                  "Why is {c} important?", "Give me an everyday example of {c}.",
                  "What is {c}? Keep it short.", "Describe {c} step by step."], g
                 ).format(c=c, aud=_pick(AUDIENCES, g))


def _code(g, functions):
    kind = _int(0, 3, g)
    if kind <= 1:
        return _pick(["Write a {l} function that {t}.", "In {l}, how would I write code that {t}?",
                      "Show me a {l} program that {t}, with a short explanation.",
                      "Write a {l} function that {t} and add a few test cases."], g
                     ).format(l=_pick(LANGUAGES_CODE, g), t=_pick(CODE_TASKS, g))
    src = _pick(functions, g)
    return _pick(["Explain what this Python function does:\n\n{s}",
                  "Add comments to this Python code:\n\n{s}",
                  "Can this function be simplified? Explain.\n\n{s}",
                  "Describe the inputs and outputs of this function:\n\n{s}"], g).format(s=src)


def _math(g):
    n1, n2 = _pick(NAMES, g), _pick(NAMES, g)
    item, price = _pick(ITEMS, g)
    a, b, c = _int(2, 40, g), _int(2, 25, g), _int(2, 9, g)
    t = _pick([
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
                    big=int(a * price) + _int(1, 20, g))


def _factual(g):
    return _pick([
        "Tell me about the geography of {co}.", "What is {co} known for?", "What languages are spoken in {co}?",
        "Describe a traditional dish from {co}.", "Who was {p} and why are they remembered?",
        "What were the main achievements of {p}?", "What is {e} used for?", "Where is {e} found in nature?",
        "How do {an} communicate?", "What do {an} eat, and where do they live?",
        "Give me three interesting facts about {t}.", "What is the history of {t}?",
    ], g).format(co=_pick(COUNTRIES, g), p=_pick(PEOPLE, g), e=_pick(ELEMENTS, g),
                 an=_pick(ANIMALS, g), t=_pick(TOPICS, g))


def _given_text(g, passages):
    p = _pick(passages, g)
    return _pick([
        "Summarise the following text in two sentences:\n\n{p}", "Give a one-line summary of this paragraph:\n\n{p}",
        "Rewrite the following paragraph in plain, simple language:\n\n{p}",
        "List the key points of this text as bullet points:\n\n{p}",
        "Rewrite this text so that it sounds friendlier:\n\n{p}",
        "Read this passage and write three questions about it:\n\n{p}",
        "Shorten this text to about half its length:\n\n{p}",
    ], g).format(p=p)


def _translate(g):
    s = f"{_pick(SENTENCE_SUBJECTS, g)} {_pick(SENTENCE_PREDICATES, g)}."
    lang = _pick(HUMAN_LANGUAGES, g)
    return _pick(["Translate into {l}: \"{s}\"", "How do you say \"{s}\" in {l}?",
                  "Translate the following sentence to {l} and explain any tricky words: {s}"], g
                 ).format(l=lang, s=s)


# (category, weight): chat and writing dominate real use; every category stays present.
CATEGORIES = [("chat", 3), ("writing", 3), ("explanation", 3), ("code", 2), ("math", 2),
              ("factual", 2), ("given_text", 2), ("translation", 1)]


def build_prompts(n: int, seed: int = 0) -> list[Prompt]:
    """``n`` distinct prompts, reproducible from ``seed``, eval-overlapping ones removed."""
    g = torch.Generator().manual_seed(seed)
    passages, functions = stdlib_passages(), stdlib_functions()
    makers = {
        "chat": _chat, "writing": _writing, "explanation": _explain, "math": _math, "factual": _factual,
        "translation": _translate, "code": lambda g: _code(g, functions),
        "given_text": lambda g: _given_text(g, passages),
    }
    weights = torch.tensor([w for _, w in CATEGORIES], dtype=torch.float)
    eval_index = EvalIndex.from_dir(EVAL_DIR)
    seen: set[str] = set()
    out: list[Prompt] = []
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 50 * n + 1000:
            raise RuntimeError(f"could only build {len(out)} distinct prompts of the {n} asked for")
        cat = CATEGORIES[int(torch.multinomial(weights, 1, generator=g))][0]
        text = makers[cat](g)
        key = normalise(text)
        if key in seen or eval_index.overlaps(text):
            continue
        seen.add(key)
        out.append(Prompt(id=f"p{len(out):06d}", category=cat, text=text))
    return out


# --- overlap with the evaluation sets -------------------------------------------------------

def normalise(text: str) -> str:
    """Lower-case words and digits only, single spaces: what near-duplicate checks compare."""
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def ngrams(text: str, n: int = 3) -> set[tuple[str, ...]]:
    words = normalise(text).split()
    if len(words) < n:
        return {tuple(words)} if words else set()
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def eval_questions(eval_dir: Path = EVAL_DIR) -> list[str]:
    """Every turn of every evaluation set (not only first turns: none may be trained on)."""
    out = []
    for path in sorted(Path(eval_dir).glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                out.extend(json.loads(line)["turns"])
    if not out:
        raise FileNotFoundError(f"no evaluation questions found in {eval_dir}")
    return out


class EvalIndex:
    """Word-trigram index of the eval questions for fast near-duplicate tests.

    A prompt overlaps a question when their normalised texts are equal, or their trigram
    Jaccard similarity is >= ``jaccard``, or >= ``containment`` of the question's trigrams
    appear in the prompt (catches a short eval instruction pasted into a longer prompt).
    """

    def __init__(self, questions: list[str], n: int = 3, jaccard: float = 0.5, containment: float = 0.8):
        self.n, self.jaccard, self.containment = n, jaccard, containment
        self.exact = {normalise(q) for q in questions}
        self.grams = [ngrams(q, n) for q in questions]
        self.by_gram: dict[tuple[str, ...], list[int]] = {}
        for i, gs in enumerate(self.grams):
            for gram in gs:
                self.by_gram.setdefault(gram, []).append(i)

    @classmethod
    def from_dir(cls, eval_dir: Path = EVAL_DIR, **kw) -> "EvalIndex":
        return cls(eval_questions(eval_dir), **kw)

    def closest(self, text: str) -> tuple[float, float]:
        """(max Jaccard, max containment) of ``text`` against all questions."""
        grams = ngrams(text, self.n)
        shared: dict[int, int] = {}
        for gram in grams:
            for i in self.by_gram.get(gram, ()):
                shared[i] = shared.get(i, 0) + 1
        best_j = best_c = 0.0
        for i, k in shared.items():
            q = self.grams[i]
            best_j = max(best_j, k / len(grams | q))
            if len(q) >= 4:  # containment is meaningless for one- or two-trigram questions
                best_c = max(best_c, k / len(q))
        return best_j, best_c

    def overlaps(self, text: str) -> bool:
        if normalise(text) in self.exact:
            return True
        j, c = self.closest(text)
        return j >= self.jaccard or c >= self.containment


def save_prompts(prompts: list[Prompt], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(p.__dict__) + "\n" for p in prompts))
    tmp.rename(path)


def load_prompts(path: Path) -> list[Prompt]:
    return [Prompt(**json.loads(line)) for line in Path(path).read_text().splitlines() if line.strip()]
