"""The word pools the training-prompt generators draw from: data only, no code.

``app/train/prompts.py`` holds one generator per category (chat, writing, code, role-play,
extraction, ...); each fills a task template with picks from these hand-written lists, using
the prompt set's seeded ``torch.Generator``. They are kept apart from the templates so that a
generator reads as its templates, and so that it is plain where the prompt set's vocabulary is.

Every prompt depends on these lists' contents *and order* (a pick is an index drawn from the
generator): editing one changes every prompt drawn after it, while the feature shards on disk
are indexed by prompt (``tests/test_train.py`` checks the seeds). Add a new list for a new
family instead of editing one in use.

Two generations, as in ``prompts.build_prompts``: the first (prompts 0-8,191) and the second
(prompts 8,192 onwards), whose families came from the categories the head found hardest.
"""
from __future__ import annotations


# --- first generation (prompts 0-8,191) -----------------------------------------------

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


# extraction: parts of made-up reviews, people and sales records
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


# stem
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


# humanities
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


# reasoning puzzles
ADJECTIVES = [("taller", "shortest"), ("older", "youngest"), ("faster", "slowest"), ("heavier", "lightest")]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
CLASSES = [("cats", "mammals", "pets"), ("roses", "flowers", "red things"), ("squares", "rectangles", "shapes with equal sides"),
           ("poets", "writers", "teachers"), ("whales", "animals that live in water", "mammals"),
           ("apples", "fruits", "green things"), ("violins", "instruments", "wooden objects")]
