"""Training prompts for self-distillation: topics × task templates, disjoint from the eval sets.

EAGLE trains its head on the *target's own* answers (self-distillation) to a broad set of user
turns; the head only has to predict what the target will say, so the prompts matter for their
variety, not for their answers. Here every prompt is built offline from:

* hand-written topic lists and task templates, combined by a seeded ``torch.Generator``: a
  first generation (chat, writing, explanation, code, math word problems, factual QA,
  translation; prompts 0-8,191) and, appended after it, a second (role-play, extraction from
  made-up reviews, people and sales records, STEM processes and misconceptions, humanities
  essays and debates, small reasoning puzzles);
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


# --- second generation (prompts 8,192 onwards): the mt_bench categories the head found hardest

# Release 4's per-category tau on the 80 mt_bench first turns (extraction 2.49, stem 2.58,
# humanities 2.73, writing 2.83, roleplay 2.91, reasoning 2.96, math 3.07, coding 3.22) and the
# first generation's mix (no role-play, extraction or reasoning family; explanation and factual
# templates used up) point at these five families.

PERSONAS = [
    "a ship's captain in the 1850s", "a museum tour guide", "a detective in a 1940s crime novel",
    "a medieval blacksmith", "a friendly household robot", "a personal fitness coach", "a travel agent",
    "a head chef on a busy Saturday night", "a park ranger", "the commander of a space station",
    "a school librarian", "the founder of a small start-up", "a school principal", "a wise old oak tree",
    "a street painter in Paris", "a football commentator", "a customer service agent", "a time traveller from the year 2400",
    "a beekeeper", "a lighthouse keeper", "a mountain guide", "a marine biologist", "a kindergarten teacher",
    "a village doctor", "a radio DJ", "a career counsellor", "a nutritionist", "a tailor", "a train conductor",
    "an astronaut on the way to Mars", "a dragon who guards a library", "a retired opera singer",
    "a zookeeper", "a pirate who has become a baker", "a barista", "a city mayor", "a ghost in an old castle",
    "a news anchor", "a game designer", "a veterinarian", "a sommelier", "a firefighter", "a stand-up comedian",
] + PEOPLE

ROLE_TASKS = [
    "describe a typical day at work", "give advice to someone who is {a}", "explain {t} to a curious visitor",
    "tell the story of the hardest decision you ever made", "give a short speech to encourage your team",
    "answer a child who asks why your job matters", "describe the most surprising thing you have seen",
    "recommend three books and say why", "explain what you would change about the world",
    "welcome a group of new students", "complain, politely, about the weather this week",
    "share your favourite memory", "describe your workplace to someone who has never seen it",
    "explain how you deal with stress", "give a newcomer five rules to live by",
]


def _roleplay(g):
    persona = _pick(PERSONAS, g)
    task = _pick(ROLE_TASKS, g).format(a=_pick(ACTIVITIES, g), t=_pick(TOPICS, g))
    return _pick([
        "Pretend you are {p}. {T}.", "Act as {p} and {task}.", "You are {p}. Stay in character and {task}.",
        "Imagine you are {p}. In your own voice, {task}.", "Play the role of {p}: {task}.",
        "I'd like you to speak as {p} would. Please {task}.",
        "From now on you are {p}. A visitor asks you about {t}. What do you say?",
        "Take on the persona of {p} and write a short monologue about {t}.",
    ], g).format(p=persona, task=task, T=task[0].upper() + task[1:], t=_pick(TOPICS, g))


PRODUCTS = ["wireless headphones", "a coffee grinder", "hiking boots", "a laptop stand", "a rice cooker",
            "a reading lamp", "a yoga mat", "a smartwatch", "a travel backpack", "an electric kettle",
            "a board game", "a desk chair", "running shoes", "a phone case", "a blender", "a tent"]
PRAISES = ["works perfectly", "arrived quickly", "is well made", "is easy to use", "looks great",
           "was worth every penny", "exceeded my expectations", "is very quiet"]
FAULTS = ["broke after a week", "is too heavy", "arrived late", "is louder than expected",
          "was missing a part", "feels cheap", "is hard to clean", "stopped charging"]
CITIES = ["Lisbon", "Nairobi", "Osaka", "Santiago", "Oslo", "Hanoi", "Marrakesh", "Toronto", "Lima",
          "Helsinki", "Cairo", "Bangkok", "Dublin", "Kathmandu", "Accra", "Krakow", "Athens", "Bogota"]
JOBS = ["engineer", "nurse", "teacher", "designer", "accountant", "chef", "pilot", "librarian",
        "architect", "pharmacist", "journalist", "electrician"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]


def _synthetic_text(g) -> tuple[str, str]:
    """A short made-up document and what kind it is: reviews, people, or sales records."""
    kind = _int(0, 2, g)
    k = _int(3, 5, g)
    if kind == 0:
        lines = []
        for i in range(k):
            # "The <product>": the product's first word (its article, or for "wireless headphones"
            # an adjective) is dropped; kept as is because shards 128+ were answered with it
            good = _int(0, 1, g)
            lines.append(f"Review {i + 1} ({_pick(NAMES, g)}): The {_pick(PRODUCTS, g).split(' ', 1)[-1]} "
                         f"{_pick(PRAISES if good else FAULTS, g)}, and it {_pick(FAULTS if good else PRAISES, g)}.")
        return "\n".join(lines), "reviews"
    if kind == 1:
        lines = [f"{_pick(NAMES, g)} is a {_int(22, 68, g)}-year-old {_pick(JOBS, g)} who moved to "
                 f"{_pick(CITIES, g)} in {_int(1990, 2023, g)}." for _ in range(k)]
        return " ".join(lines), "people"
    lines = [f"On {_int(1, 28, g)} {_pick(MONTHS, g)}, {_pick(NAMES, g)} sold {_int(2, 90, g)} {_pick(ITEMS, g)[0]} "
             f"in {_pick(CITIES, g)} for ${_int(5, 900, g)}." for _ in range(k)]
    return " ".join(lines), "sales"


def _extraction(g, passages):
    if _int(0, 3, g) == 0:   # structure from real prose
        return _pick([
            "Read the text below and return a JSON object with the keys \"topic\", \"keywords\" (a list of "
            "five) and \"summary\" (one sentence).\n\n{p}",
            "List every technical term in this passage with a short definition of each, as a table.\n\n{p}",
            "From the following text, extract all instructions or rules it gives, numbered.\n\n{p}",
            "Identify the main claim of this paragraph and the evidence for it. Answer in two labelled lines.\n\n{p}",
        ], g).format(p=_pick(passages, g))
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
    return f"{_pick(asks, g)}\n\n{text}"


STEM_PROCESSES = [
    "cellular respiration", "nuclear fission", "protein synthesis", "soil erosion", "the formation of stars",
    "superconductivity", "osmosis", "combustion", "the nitrogen cycle", "doping a semiconductor",
    "radioactive decay", "the refraction of light", "evaporation and condensation", "mitosis", "catalysis",
    "covalent bonding", "how enzymes speed up reactions", "heat conduction", "lift on an aeroplane wing",
    "how a transistor switches", "the life cycle of a star", "blood clotting", "how batteries store energy",
    "how the ear turns sound into signals", "ocean currents", "how a refrigerator moves heat",
    "the formation of fossils", "how GPS finds a position", "how lasers produce light", "crystallisation",
    "how a vaccine trains the immune system", "continental drift", "how antibiotics kill bacteria",
    "how a rocket works in the vacuum of space", "electromagnetic induction", "how a microwave oven heats food",
]
MISCONCEPTIONS = [
    "heavier objects always fall faster than lighter ones", "the seasons are caused by the Earth's distance from the Sun",
    "glass is a slow-moving liquid", "lightning never strikes the same place twice",
    "humans use only ten percent of their brains", "blood is blue inside the body", "bats are blind",
    "evolution means that animals try to adapt", "a penny dropped from a skyscraper could kill someone",
    "cold weather by itself makes you catch a cold", "the tongue has separate zones for each taste",
    "metal objects feel cold because they are colder than the air", "astronauts float because there is no gravity in orbit",
]
QUANTITIES = ["the distance to a nearby star", "the age of a rock", "the speed of sound", "air pressure",
              "the mass of the Earth", "blood pressure", "the temperature of the Sun's surface",
              "the strength of an earthquake", "the acidity of a liquid", "the size of an atom",
              "the amount of sugar in a drink", "wind speed"]
COUNTERFACTUALS = ["the Moon disappeared", "the Earth stopped rotating", "water did not expand when it freezes",
                   "plants stopped photosynthesising", "light travelled at only 100 kilometres per hour",
                   "the Earth had no magnetic field", "friction vanished for one day", "the Sun were twice as massive",
                   "humans could see infrared light", "the oceans were fresh water"]


def _stem(g):
    return _pick([
        "Describe the process of {x} and explain why it matters.", "What are the main stages of {x}?",
        "Explain the science behind {x}, including any key equations.", "Explain {x} and give a real-world application.",
        "What would happen if {cf}? Think it through scientifically.",
        "A student claims that {m}. Is this correct? Explain.", "How do scientists measure {q}?",
        "Design a simple experiment a school could run to demonstrate {x}.",
        "Explain {x} to {aud}, then give the precise scientific version.",
        "What are the most common misunderstandings about {x}?",
    ], g).format(x=_pick(STEM_PROCESSES, g), cf=_pick(COUNTERFACTUALS, g), m=_pick(MISCONCEPTIONS, g),
                 q=_pick(QUANTITIES, g), aud=_pick(AUDIENCES, g))


HISTORY_EVENTS = [
    "the French Revolution", "the fall of the Western Roman Empire", "the Industrial Revolution", "the invention of writing",
    "the Cold War", "the abolition of slavery in the British Empire", "the Meiji Restoration", "the Black Death",
    "the Age of Exploration", "the women's suffrage movement", "the founding of the United Nations",
    "the Great Depression", "the Protestant Reformation", "the collapse of the Soviet Union", "the Green Revolution in agriculture",
    "the partition of India", "the building of the transcontinental railroads", "the Scientific Revolution",
    "the Apollo programme", "the end of apartheid", "the spread of the bubonic plague along trade routes",
]
IDEAS = [
    "utilitarianism", "stoicism", "the social contract", "existentialism", "free will", "cultural relativism",
    "the tragedy of the commons", "Keynesian economics", "globalisation", "comparative advantage",
    "the separation of powers", "the division of labour", "behavioural economics", "the veil of ignorance",
    "Confucian ethics", "Plato's allegory of the cave", "nationalism", "the rule of law", "soft power",
]
DEBATES = [
    "banning cars from city centres", "compulsory voting", "public funding for the arts", "keeping animals in zoos",
    "a four-day working week", "school uniforms", "taxing sugary drinks", "nuclear power", "universal basic income",
    "homework for primary-school children", "raising the minimum wage", "space exploration budgets",
    "remote work as the default", "standardised exams", "a ban on single-use plastics",
]
ARTS = ["impressionist painting", "Shakespeare's tragedies", "Greek mythology", "the Epic of Gilgamesh",
        "Baroque music", "haiku poetry", "film noir", "Gothic cathedrals", "the Harlem Renaissance",
        "ukiyo-e woodblock prints", "Russian novels of the nineteenth century", "hip-hop", "Bauhaus design"]


def _humanities(g):
    i1, i2 = _pick(IDEAS, g), _pick(IDEAS, g)
    return _pick([
        "Discuss the causes and consequences of {e}.", "What lessons can we learn today from {e}?",
        "How did {e} change everyday life for ordinary people?", "Explain the main ideas of {i} and one criticism of it.",
        "Present the arguments for and against {d}.", "Write a short, balanced essay on {d}.",
        "Compare {i} with {i2}.", "How did {a} influence later culture?",
        "What can {i} tell us about a modern problem such as {d}?", "Explain {i} using an example from {e}.",
        "Outline an economist's view of {d}.", "Why do historians still argue about {e}?",
    ], g).format(e=_pick(HISTORY_EVENTS, g), i=i1, i2=i2 if i2 != i1 else "pragmatism",
                 d=_pick(DEBATES, g), a=_pick(ARTS, g))


ADJECTIVES = [("taller", "shortest"), ("older", "youngest"), ("faster", "slowest"), ("heavier", "lightest")]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
CLASSES = [("cats", "mammals", "pets"), ("roses", "flowers", "red things"), ("squares", "rectangles", "shapes with equal sides"),
           ("poets", "writers", "teachers"), ("whales", "animals that live in water", "mammals"),
           ("apples", "fruits", "green things"), ("violins", "instruments", "wooden objects")]


def _reasoning(g):
    kind = _int(0, 5, g)
    names = []
    while len(names) < 4:  # four distinct names
        n = _pick(NAMES, g)
        if n not in names:
            names.append(n)
    a, b, c, d = names
    if kind == 0:
        more, least = _pick(ADJECTIVES, g)
        return (f"{a} is {more} than {b}. {c} is {more} than {a}, and {b} is {more} than {d}. "
                f"Who is the {least}, and how do you know?")
    if kind == 1:
        x, y, z = _pick(CLASSES, g)
        return _pick([f"All {x} are {y}. Some {y} are {z}. Does it follow that some {x} are {z}? Explain.",
                      f"If every one of the {x} is one of the {y}, and no {y} are {z}, can any {x} be {z}? Why?"], g)
    if kind == 2:
        day, n = _pick(DAYS, g), _int(3, 400, g)
        return _pick([f"If today is {day}, what day of the week will it be in {n} days? Show the reasoning.",
                      f"A meeting happens every {_int(2, 9, g)} days, starting on a {day}. "
                      f"On which day of the week is meeting number {_int(3, 12, g)}?"], g)
    if kind == 3:
        start, step = _int(1, 9, g), _int(2, 7, g)
        seq = [start + step * i for i in range(5)] if _int(0, 1, g) else [start * step ** i for i in range(5)]
        return f"What number comes next in the sequence {', '.join(map(str, seq))}? Explain the rule."
    if kind == 4:
        r, bl = _int(2, 9, g), _int(2, 9, g)
        return _pick([f"A bag holds {r} red and {bl} blue marbles. If you draw two without looking, what is the "
                      "chance that both are red?",
                      f"{a} rolls two dice. What is the probability that the total is {_int(3, 11, g)}? Explain."], g)
    return _pick([f"{a} is {b}'s mother and {c} is {a}'s father. How is {c} related to {b}?",
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
