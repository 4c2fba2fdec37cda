"""The embedded default data set: a deterministic synthetic voice-assistant QA log.

One JSON Lines file per day (`<out_dir>/YYYY-MM-DD.jsonl`); each line is one logged request:

    timestamp, request_id, session_id, locale, device, question, answer_id, confidence

What makes it a useful stand-in for real logs (Bonadiman et al. 2019, section 4.1.1):

- Answer intents are built combinatorially: a *family* (hand-written paraphrase templates,
  e.g. "how tall is {x}", "{bare} height", ...) times its slot values ("the eiffel tower",
  ...). Each (family, slot value) is its own answer id. Paraphrases of one intent share
  varying amounts of wording, from near-identical to only the slot words.
- ASR-like noise on a fraction of rows: misheard words from a small confusion table,
  truncation, dropped words, fillers, odd casing; most transcripts carry no punctuation.
- Generic answers ("yes", a bare number, "I don't know") shared by many unrelated
  questions. Their clusters are incoherent (coherence c < 0.1) so the coherence filter has
  real work; ordinary intent clusters sit well above 0.1.
- False negatives: ~2% of an intent's rows are logged under a related intent's answer id.
- Zipf-like popularity over intents, user sessions (a user often rephrases), a diurnal
  traffic curve, and rare junk rows (empty ASR transcripts, exact duplicate retries).

Determinism: a day's file depends only on (seed, day, intents, rows_per_day). Every random
draw comes from `random.Random` seeded with a string (Python hashes str seeds with SHA-512,
which is stable across machines and runs, unlike `hash()`), each day has its own generator,
and nothing iterates over a set, so a day's bytes are the same whether it is generated alone
or as part of a range.
"""

from __future__ import annotations

import itertools
import json
import random
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any

from qpr.io import write_bytes_atomic

__all__ = [
    "CONFUSIONS",
    "FIELDS",
    "GENERIC_ANSWER_IDS",
    "Intent",
    "SynthSpec",
    "generate_day",
    "intent_catalogue",
    "max_intents",
    "write_day",
    "write_logs",
]

FIELDS: tuple[str, ...] = (
    "timestamp",
    "request_id",
    "session_id",
    "locale",
    "device",
    "question",
    "answer_id",
    "confidence",
)


@dataclass(frozen=True)
class SynthSpec:
    """What to generate: `days` daily files starting at `start`."""

    seed: int = 13
    start: date = date(2026, 10, 1)
    days: int = 14
    rows_per_day: int = 2200
    intents: int = 400

    @classmethod
    def from_settings(cls, synth: Any) -> SynthSpec:
        """The spec params.yaml's `data.synth` section describes (qpr.config.SynthSettings)."""
        return cls(
            seed=synth.seed,
            start=synth.start,
            days=synth.days,
            rows_per_day=synth.rows_per_day,
            intents=synth.intents,
        )


@dataclass(frozen=True)
class Intent:
    """One answer id and the clean questions that are logged under it.

    `paraphrases` are the clean surface forms (template × slot value, or for a generic
    answer its many unrelated questions); `related` is the answer id its false negatives
    are logged under (None for generic answers or a family with a single intent);
    `weight` is its share of the traffic (all weights sum to 1).
    """

    answer_id: str
    family: str
    topic: str
    paraphrases: tuple[str, ...]
    related: str | None
    weight: float
    generic: bool = False


# --------------------------------------------------------------------------------------
# Content: template families and their slot values
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Family:
    name: str
    topic: str
    templates: tuple[str, ...]
    slots: tuple[str, ...]  # "a|b" fills keys ("a", "b")
    keys: tuple[str, ...] = ("x",)
    popularity: float = 1.0  # relative traffic of the whole family (weather beats spelling)


def _pairs(left: Sequence[str], right: Sequence[str]) -> tuple[str, ...]:
    return tuple(f"{a}|{b}" for a, b in itertools.product(left, right))


_CITIES = (
    "london", "new york", "paris", "tokyo", "sydney", "chicago", "seattle", "mumbai",
    "toronto", "berlin", "dubai", "los angeles", "san francisco", "boston", "miami",
    "melbourne", "delhi", "singapore", "hong kong", "rome", "madrid", "dallas", "denver",
    "atlanta", "bangalore", "manchester", "edinburgh", "auckland", "cape town", "honolulu",
)  # fmt: skip
_COUNTRIES = (
    "france", "germany", "japan", "australia", "canada", "brazil", "india", "italy", "spain",
    "mexico", "egypt", "kenya", "nigeria", "argentina", "chile", "peru", "norway", "sweden",
    "finland", "poland", "greece", "turkey", "thailand", "vietnam", "indonesia", "south korea",
    "new zealand", "ireland", "portugal", "switzerland", "austria", "belgium", "morocco",
    "iceland", "colombia", "pakistan", "bangladesh", "saudi arabia", "ukraine", "hungary",
)  # fmt: skip
_TEAMS = (
    "the yankees", "the lakers", "the packers", "the cowboys", "the patriots", "the red sox",
    "the warriors", "the celtics", "the dodgers", "the bulls", "the chiefs", "the eagles",
    "the knicks", "the cubs", "the steelers", "the giants", "the heat", "the mets",
    "the bears", "the raiders", "the seahawks", "the broncos",
)  # fmt: skip
_ANIMALS = (
    "dogs|dog", "cats|cat", "horses|horse", "elephants|elephant", "turtles|turtle",
    "parrots|parrot", "hamsters|hamster", "goldfish|goldfish", "rabbits|rabbit", "cows|cow",
    "lions|lion", "whales|whale", "bees|bee", "chickens|chicken", "guinea pigs|guinea pig",
    "tortoises|tortoise", "sharks|shark", "owls|owl", "ants|ant", "crows|crow",
    "pandas|panda", "koalas|koala", "hedgehogs|hedgehog", "giraffes|giraffe",
)  # fmt: skip
_PLANETS = (
    "mercury", "venus", "mars", "jupiter", "saturn", "uranus", "neptune", "pluto",
)  # fmt: skip
# Percent questions whose answer is a generic number would belong to a generic answer.
_PERCENTS = tuple(
    f"{p}|{n}"
    for p, n in itertools.product(
        (5, 10, 15, 20, 25, 30, 40, 75), (40, 60, 80, 120, 150, 200, 250, 360, 500, 1200)
    )
    if p * n / 100 not in (3, 4, 7, 12)
)

# fmt: off
_FAMILIES: tuple[_Family, ...] = (
    _Family(
        "weather", "weather",
        (
            "what's the weather in {x}", "what is the weather like in {x} today", "weather {x}",
            "is it going to rain in {x}", "do i need an umbrella in {x} today",
            "how hot is it in {x} right now", "forecast for {x}",
            "tell me the weather forecast for {x}", "what's the temperature in {x}",
        ),
        _CITIES, popularity=2.5,
    ),
    _Family(
        "local_time", "time zones",
        (
            "what time is it in {x}", "current time in {x}", "what's the time in {x} right now",
            "{x} time", "how many hours ahead is {x}", "what time zone is {x} in",
            "tell me the local time in {x}", "time difference with {x}",
        ),
        _CITIES, popularity=1.5,
    ),
    _Family(
        "unit_conversion", "unit conversion",
        (
            "how many {a} in {a_b}", "how many {a} are in one {b}", "convert {a_b} to {a}",
            "{b} to {a}", "one {b} in {a}", "what is {a_b} in {a}", "how many {a} make {a_b}",
            "{a_b} equals how many {a}",
        ),
        (
            "ounces|pound", "grams|ounce", "centimeters|inch", "feet|mile", "meters|mile",
            "kilometers|mile", "milliliters|cup", "tablespoons|cup", "teaspoons|tablespoon",
            "cups|quart", "pints|gallon", "liters|gallon", "pounds|kilogram", "yards|mile",
            "seconds|day", "minutes|week", "inches|yard", "millimeters|inch", "feet|meter",
            "acres|square mile", "ounces|cup", "cups|liter", "grams|pound", "quarts|gallon",
            "hours|week", "calories|kilojoule",
        ),
        keys=("a", "b"),
    ),
    _Family(
        "temperature_conversion", "unit conversion",
        (
            "what is {x} fahrenheit in celsius", "{x} f to c",
            "convert {x} degrees fahrenheit to celsius", "{x} fahrenheit in celsius",
            "how much is {x} degrees fahrenheit in celsius", "what's {x} degrees in celsius",
            "change {x} fahrenheit to centigrade",
        ),
        ("0", "20", "45", "50", "60", "65", "70", "75", "80", "90", "100", "212", "350", "400",
         "425", "450"),
    ),
    _Family(
        "landmark_height", "geography",
        (
            "how tall is {x}", "what's the height of {x}", "{bare} height", "how high is {x}",
            "tell me how tall {x} is", "how many feet tall is {x}",
            "what is the height of {x} in meters", "height of {x}",
        ),
        (
            "the eiffel tower", "the empire state building", "big ben", "the statue of liberty",
            "mount everest", "the burj khalifa", "the space needle", "the cn tower",
            "the leaning tower of pisa", "mount kilimanjaro", "the great pyramid of giza",
            "the shard", "the washington monument", "the gateway arch", "tokyo tower",
            "christ the redeemer", "the taj mahal", "the petronas towers", "k2", "mont blanc",
            "ben nevis", "uluru", "the matterhorn", "angel falls", "niagara falls",
        ),
    ),
    _Family(
        "capital", "geography",
        (
            "what is the capital of {x}", "what's {x}'s capital", "capital of {x}",
            "{x} capital city", "which city is the capital of {x}",
            "name the capital city of {x}", "where is the seat of government in {x}",
            "tell me the capital of {x}",
        ),
        _COUNTRIES, popularity=1.3,
    ),
    _Family(
        "population", "geography",
        (
            "what is the population of {x}", "how many people live in {x}", "{x} population",
            "population of {x}", "how many people are in {x}",
            "how big is the population of {x}", "how many residents does {x} have",
        ),
        _COUNTRIES,
    ),
    _Family(
        "currency", "geography",
        (
            "what currency does {x} use", "what's the currency in {x}", "{x} currency",
            "what money do they use in {x}", "which currency is used in {x}",
            "what do they pay with in {x}", "currency of {x}",
        ),
        _COUNTRIES,
    ),
    _Family(
        "longest_river", "geography",
        (
            "what is the longest river in {x}", "longest river in {x}",
            "which river in {x} is the longest", "{bare} longest river",
            "what's the biggest river in {x}", "name the longest river of {x}",
            "tell me the longest river in {x}",
        ),
        (
            "africa", "europe", "asia", "south america", "north america", "australia",
            "the united states", "china", "india", "england", "france", "germany", "canada",
            "brazil", "russia", "scotland", "japan",
        ),
    ),
    _Family(
        "where_is", "geography",
        (
            "where is {x}", "where is {x} located", "what continent is {x} in",
            "{bare} location", "which country is {x} in", "show me where {x} is",
            "where's {x} on the map",
        ),
        (
            "madagascar", "timbuktu", "machu picchu", "bora bora", "kathmandu", "reykjavik",
            "tasmania", "zanzibar", "the maldives", "bali", "patagonia", "transylvania",
            "lapland", "the gobi desert", "angkor wat", "petra", "easter island",
            "the galapagos islands", "sicily", "crete", "yosemite", "banff",
        ),
    ),
    _Family(
        "distance", "geography",
        (
            "how far is {a} from {b}", "distance from {a} to {b}",
            "how many miles from {a} to {b}", "{a} to {b} distance",
            "how long is the drive from {a} to {b}", "how far apart are {a} and {b}",
            "what's the distance between {a} and {b}",
        ),
        (
            "new york|boston", "london|paris", "los angeles|san francisco", "chicago|detroit",
            "sydney|melbourne", "delhi|mumbai", "toronto|montreal", "dallas|houston",
            "berlin|munich", "seattle|portland", "miami|orlando", "tokyo|osaka",
            "madrid|barcelona", "atlanta|nashville", "denver|las vegas", "london|edinburgh",
        ),
        keys=("a", "b"),
    ),
    _Family(
        "translate", "language",
        (
            "how do you say {p} in {l}", "what's {p} in {l}", "translate {p} to {l}",
            "{p} in {l}", "how to say {p} in {l}", "what is the {l} word for {p}",
            "say {p} in {l}",
        ),
        _pairs(
            ("hello", "thank you", "good morning", "i love you", "goodbye", "cheers",
             "how are you", "please", "good night", "happy birthday"),
            ("spanish", "french", "german", "italian", "japanese", "chinese", "korean",
             "portuguese", "hindi", "arabic", "russian"),
        ),
        keys=("p", "l"),
    ),
    _Family(
        "spelling", "spelling",
        (
            "how do you spell {x}", "spell {x}", "what's the spelling of {x}",
            "how is {x} spelled", "spell the word {x}", "{x} spelling",
            "can you spell {x} for me", "how to spell {x}",
        ),
        (
            "necessary", "restaurant", "definitely", "accommodate", "rhythm", "separate",
            "conscience", "embarrass", "occasionally", "mississippi", "bureaucracy",
            "entrepreneur", "conscientious", "questionnaire", "maintenance", "liaison",
            "millennium", "colonel", "receipt", "february", "wednesday", "beautiful",
            "broccoli", "schedule",
        ),
    ),
    _Family(
        "definition", "definitions",
        (
            "what does {x} mean", "define {x}", "definition of {x}",
            "what is the meaning of {x}", "{x} meaning", "meaning of the word {x}",
            "what do people mean by {x}", "explain the word {x}",
        ),
        (
            "ubiquitous", "serendipity", "ephemeral", "gaslighting", "procrastinate",
            "schadenfreude", "quixotic", "nostalgia", "irony", "empathy", "pragmatic",
            "cryptocurrency", "algorithm", "inflation", "entropy", "sonder", "hygge",
            "gerrymandering", "filibuster", "karma", "juxtaposition", "paradigm", "zeitgeist",
            "onomatopoeia", "ambivalent", "hubris",
        ),
    ),
    _Family(
        "holiday", "holidays",
        (
            "when is {x}", "what date is {x} this year", "{x} date", "how many days until {x}",
            "when is {x} this year", "what day does {x} fall on",
            "is {x} on a weekend this year", "countdown to {x}",
        ),
        (
            "christmas", "easter", "thanksgiving", "halloween", "mother's day", "father's day",
            "valentine's day", "labor day", "memorial day", "hanukkah", "diwali",
            "chinese new year", "ramadan", "passover", "st patrick's day", "independence day",
            "new year's eve", "boxing day", "black friday", "martin luther king day",
        ),
        popularity=1.3,
    ),
    _Family(
        "book_author", "books",
        (
            "who wrote {x}", "who is the author of {x}", "{x} author", "who's the writer of {x}",
            "what author wrote {x}", "tell me who wrote the book {x}", "who was {x} written by",
            "author of {x}",
        ),
        (
            "pride and prejudice", "moby dick", "war and peace", "the great gatsby",
            "to kill a mockingbird", "nineteen eighty four", "the hobbit", "romeo and juliet",
            "the odyssey", "don quixote", "frankenstein", "dracula", "jane eyre",
            "wuthering heights", "the catcher in the rye", "brave new world",
            "the old man and the sea", "of mice and men", "little women", "the grapes of wrath",
            "crime and punishment", "one hundred years of solitude", "the lord of the rings",
            "the da vinci code", "the hunger games", "ulysses",
        ),
    ),
    _Family(
        "song_singer", "music",
        (
            "who sings {x}", "who sang {x}", "{x} singer", "who's the artist for {x}",
            "who did the song {x}", "who performs the song {x}", "who recorded {x}",
            "name the singer of {x}",
        ),
        (
            "bohemian rhapsody", "hey jude", "purple rain", "rolling in the deep", "shape of you",
            "billie jean", "hotel california", "wonderwall", "smells like teen spirit",
            "like a rolling stone", "imagine", "dancing queen", "halo", "bad guy",
            "blinding lights", "uptown funk", "let it be", "sweet caroline", "africa",
            "take on me", "someone like you", "toxic", "umbrella", "despacito",
            "old town road", "poker face",
        ),
    ),
    _Family(
        "play_music", "music",
        (
            "play {x}", "put on {x}", "play some {x}", "i want to listen to {x}",
            "can you play {x}", "start playing {x}", "{x} music please", "shuffle {x}",
        ),
        (
            "jazz", "classical music", "taylor swift", "the beatles", "lofi beats",
            "country music", "beyonce", "christmas music", "rain sounds", "white noise",
            "the rolling stones", "drake", "hip hop", "80s hits", "relaxing music", "coldplay",
            "queen", "elvis", "fleetwood mac", "reggae",
        ),
        popularity=2.5,
    ),
    _Family(
        "celebrity_age", "people",
        (
            "how old is {x}", "what's {x}'s age", "{x} age", "when was {x} born",
            "what year was {x} born", "how old is {x} now", "{x} birthday",
            "tell me {x}'s age",
        ),
        (
            "taylor swift", "beyonce", "tom hanks", "oprah winfrey", "lebron james",
            "serena williams", "elton john", "dolly parton", "keanu reeves", "adele", "shakira",
            "rihanna", "bruce springsteen", "paul mccartney", "mick jagger", "morgan freeman",
            "denzel washington", "meryl streep", "jennifer lopez", "cristiano ronaldo",
            "lionel messi", "roger federer", "ed sheeran", "lady gaga", "harrison ford",
        ),
    ),
    _Family(
        "team_next_game", "sports",
        (
            "when do {x} play next", "when is the next {bare} game", "{bare} schedule",
            "what time is the {bare} game", "are {x} playing tonight", "{bare} next match",
            "who do {x} play next", "when's the {bare} game on",
        ),
        _TEAMS, popularity=1.5,
    ),
    _Family(
        "team_score", "sports",
        (
            "what was the {bare} score", "did {x} win", "{bare} score",
            "who won the {bare} game", "how did {x} do last night",
            "final score of the {bare} game", "{bare} result", "did {x} win last night",
        ),
        _TEAMS, popularity=1.5,
    ),
    _Family(
        "champion", "sports",
        (
            "who won {x} last year", "{bare} winner", "who won the last {bare}",
            "who is the current {bare} champion", "which team won {x}", "{bare} champions",
            "who took the {bare} title",
        ),
        (
            "the super bowl", "the world series", "the nba finals", "the stanley cup",
            "the world cup", "the champions league", "wimbledon", "the masters",
            "the tour de france", "the kentucky derby", "the premier league", "the us open",
            "the french open", "the indy 500", "the six nations", "the ryder cup",
        ),
    ),
    _Family(
        "team_size", "sports",
        (
            "how many players on {a_x} team", "how many players are on {a_x} team",
            "{x} team size", "number of players in {x}", "how many people play on {a_x} team",
            "how big is {a_x} team", "how many {x} players are on the field",
        ),
        (
            "soccer", "basketball", "baseball", "volleyball", "rugby", "hockey", "cricket",
            "water polo", "lacrosse", "american football", "netball", "handball",
        ),
    ),
    _Family(
        "boil_time", "cooking",
        (
            "how long do you boil {x}", "how long to boil {x}", "boiling time for {x}",
            "how many minutes to boil {x}", "{x} boil time",
            "how long should i cook {x} in boiling water", "how long does it take to boil {x}",
        ),
        (
            "eggs", "pasta", "rice", "potatoes", "corn on the cob", "broccoli", "carrots",
            "lobster", "shrimp", "spaghetti", "green beans", "sweet potatoes", "chicken breast",
            "quinoa", "lentils", "brussels sprouts", "asparagus", "crab legs", "dumplings",
            "hot dogs",
        ),
    ),
    _Family(
        "calories", "health",
        (
            "how many calories in {x}", "calories in {x}", "how many calories does {x} have",
            "{bare} calories", "what's the calorie count of {x}", "is {x} high in calories",
            "how fattening is {x}", "nutrition facts for {x}",
        ),
        (
            "a banana", "an apple", "an egg", "a slice of pizza", "a bagel", "an avocado",
            "a cup of rice", "a glass of milk", "a can of coke", "a big mac", "a donut",
            "an orange", "a croissant", "a glass of wine", "a beer", "peanut butter",
            "a chicken breast", "a muffin", "a latte", "a boiled egg",
        ),
    ),
    _Family(
        "substitute", "cooking",
        (
            "what can i use instead of {x}", "substitute for {x}", "{x} substitute",
            "what can replace {x} in baking", "i don't have {x} what can i use",
            "alternatives to {x}", "what's a good replacement for {x}",
        ),
        (
            "buttermilk", "baking powder", "baking soda", "heavy cream", "butter",
            "sour cream", "brown sugar", "cornstarch", "vanilla extract", "yeast", "honey",
            "self rising flour", "mayonnaise", "lemon juice", "breadcrumbs", "cream cheese",
        ),
    ),
    _Family(
        "event_date", "history",
        (
            "when did {x} happen", "what year was {x}", "{bare} date", "when was {x}",
            "how long ago was {x}", "in what year did {x} take place", "{bare} year",
        ),
        (
            "the moon landing", "the battle of hastings", "the french revolution",
            "the fall of the berlin wall", "the sinking of the titanic",
            "the american revolution", "the great fire of london", "the signing of magna carta",
            "the first world war", "the second world war", "the fall of rome",
            "the black death", "the boston tea party", "the wall street crash",
            "the chernobyl disaster", "the attack on pearl harbor", "the battle of waterloo",
            "the california gold rush", "the storming of the bastille",
            "the cuban missile crisis",
        ),
    ),
    _Family(
        "first_person", "history",
        (
            "who was the first {x}", "first {x}", "who was the very first {x}",
            "name the first {x}", "who's known as the first {x}", "tell me who the first {x} was",
            "who became the first {x}",
        ),
        (
            "person to walk on the moon", "president of the united states", "woman in space",
            "person to climb mount everest", "emperor of rome", "man in space",
            "prime minister of britain", "person to fly a plane",
            "person to sail around the world", "woman to win a nobel prize",
            "american in space", "person to reach the south pole", "female prime minister",
            "person to swim the english channel",
        ),
    ),
    _Family(
        "inventor", "history",
        (
            "who invented {x}", "who made the first {bare}", "inventor of {x}",
            "{bare} inventor", "who came up with {x}", "who created {x}",
            "who is credited with inventing {x}",
        ),
        (
            "the telephone", "the light bulb", "the internet", "the airplane",
            "the printing press", "the radio", "the television", "the computer",
            "the steam engine", "the car", "the telescope", "the world wide web", "the camera",
            "the refrigerator", "the bicycle", "the microwave", "the battery", "dynamite",
            "the phonograph", "the sewing machine",
        ),
    ),
    _Family(
        "boiling_point", "science",
        (
            "what is the boiling point of {x}", "{x} boiling point",
            "at what temperature does {x} boil", "when does {x} boil",
            "how hot does {x} need to be to boil", "boiling temperature of {x}",
            "what temperature is the boiling point of {x}",
        ),
        (
            "water", "ethanol", "milk", "olive oil", "mercury", "nitrogen", "oxygen",
            "salt water", "alcohol", "acetone", "helium", "iron", "gold", "sugar water",
        ),
    ),
    _Family(
        "planet_distance", "science",
        (
            "how far is {x} from the sun", "distance from {x} to the sun",
            "how many miles is {x} from the sun", "{x} distance from sun",
            "how far away is {x} from the sun", "what's the distance between the sun and {x}",
            "how long does light take to get from the sun to {x}",
        ),
        _PLANETS,
    ),
    _Family(
        "planet_moons", "science",
        (
            "how many moons does {x} have", "{x} moons", "number of moons of {x}",
            "does {x} have moons", "how many moons orbit {x}", "what are the moons of {x}",
            "how many natural satellites does {x} have",
        ),
        _PLANETS,
    ),
    _Family(
        "square_root", "math",
        (
            "what is the square root of {x}", "square root of {x}", "what's the root of {x}",
            "sqrt {x}", "calculate the square root of {x}", "what number squared equals {x}",
            "tell me the square root of {x}",
        ),
        ("2", "3", "10", "50", "81", "169", "200", "225", "256", "400", "500", "625", "1000",
         "2025", "20", "30"),
    ),
    _Family(
        "percent", "math",
        (
            "what is {p} percent of {n}", "{p} percent of {n}", "calculate {p} percent of {n}",
            "how much is {p} percent of {n}", "what's {p} per cent of {n}",
            "find {p} percent of {n}", "{p} percent times {n}",
        ),
        _PERCENTS, keys=("p", "n"),
    ),
    _Family(
        "lifespan", "animals",
        (
            "how long do {x} live", "what's the lifespan of {a_s}", "{s} lifespan",
            "how many years does {a_s} live", "average age of {a_s}", "how old can {x} get",
            "life expectancy of {x}",
        ),
        _ANIMALS, keys=("x", "s"),
    ),
    _Family(
        "animal_diet", "animals",
        (
            "what do {x} eat", "what does {a_s} eat", "{s} diet", "what food do {x} like",
            "what should i feed my {s}", "are {x} herbivores", "what do {x} eat in the wild",
        ),
        _ANIMALS, keys=("x", "s"),
    ),
    _Family(
        "movie_director", "movies",
        (
            "who directed {x}", "who's the director of {x}", "{x} director",
            "who made the movie {x}", "director of {x}", "what director did {x}",
            "who was behind the camera for {x}",
        ),
        (
            "titanic", "jaws", "the godfather", "pulp fiction", "jurassic park", "inception",
            "the matrix", "star wars", "casablanca", "psycho", "the shining", "forrest gump",
            "schindler's list", "avatar", "parasite", "the dark knight", "gladiator",
            "goodfellas", "alien", "back to the future", "the lion king", "frozen",
            "toy story", "oppenheimer", "la la land", "fight club",
        ),
    ),
    _Family(
        "movie_actor", "movies",
        (
            "who plays {c} in {m}", "who played {c} in {m}", "actor who plays {c} in {m}",
            "{c} actor {m}", "who is the actor for {c} in {m}", "who was cast as {c} in {m}",
            "{m} cast {c}",
        ),
        (
            "iron man|the avengers", "jack|titanic", "neo|the matrix", "katniss|the hunger games",
            "the joker|the dark knight", "han solo|star wars",
            "indiana jones|raiders of the lost ark", "hermione|harry potter",
            "gandalf|the lord of the rings", "james bond|skyfall", "wolverine|x men",
            "barbie|barbie", "elsa|frozen", "rocky|rocky",
            "jack sparrow|pirates of the caribbean", "black panther|black panther",
            "wonder woman|wonder woman", "captain america|the avengers",
        ),
        keys=("c", "m"),
    ),
    _Family(
        "symptoms", "health",
        (
            "what are the symptoms of {x}", "{bare} symptoms", "signs of {x}",
            "how do i know if i have {x}", "what does {x} feel like", "symptoms of {x} in adults",
            "early signs of {x}", "how can you tell if you have {x}",
        ),
        (
            "the flu", "covid", "strep throat", "diabetes", "a concussion", "dehydration",
            "a migraine", "food poisoning", "anemia", "pneumonia", "lyme disease",
            "appendicitis", "high blood pressure", "a heart attack", "a stroke", "measles",
            "chickenpox", "mono", "an ear infection", "a sinus infection",
        ),
    ),
    _Family(
        "remedy", "health",
        (
            "how do i get rid of {x}", "how to cure {x}", "{bare} remedy", "what helps with {x}",
            "best way to treat {x}", "home remedies for {x}", "how to stop {x} fast",
            "what is good for {x}",
        ),
        (
            "hiccups", "a headache", "a sore throat", "a cold", "heartburn", "a hangover",
            "insomnia", "a cough", "a sunburn", "a toothache", "back pain", "a stuffy nose",
            "motion sickness", "acne", "a bee sting", "dandruff", "jet lag", "leg cramps",
        ),
    ),
    _Family(
        "stock_price", "finance",
        (
            "what is {x} stock price", "{x} stock", "how is {x} stock doing",
            "{x} share price", "what's {x} trading at", "price of {x} shares",
            "is {x} stock up today",
        ),
        (
            "apple", "tesla", "amazon", "microsoft", "google", "nvidia", "netflix", "meta",
            "disney", "nike", "coca cola", "walmart", "boeing", "intel", "ford", "starbucks",
            "mcdonalds", "costco",
        ),
    ),
)
# fmt: on

# Generic answers: many unrelated questions (each with a few phrasings) share one answer id,
# as "many different math questions may map to the same answer; a given number" (paper 4.1.1).
_GENERIC: tuple[tuple[str, tuple[tuple[str, ...], ...]], ...] = (
    (
        "ans-yes",
        (
            ("is the sky blue", "is the sky really blue"),
            ("can dogs swim", "are dogs able to swim"),
            ("is a tomato a fruit", "tomato is a fruit right"),
            ("do fish sleep",),
            ("is water wet",),
            ("can penguins swim",),
            ("is the earth round", "is our planet round"),
            ("are bats mammals",),
            ("do plants need sunlight",),
            ("is chocolate bad for dogs", "can chocolate hurt my puppy"),
            ("can you freeze bread",),
            ("is pluto a dwarf planet",),
            ("do cats have whiskers",),
            ("is the sun a star",),
            ("are you listening",),
            ("do spiders have eight legs",),
            ("is gold heavier than silver",),
            ("did dinosaurs exist", "were dinosaurs real"),
            ("is honey safe to eat forever",),
            ("can octopuses change color",),
            ("is lightning hotter than the sun",),
            ("are tomatoes healthy",),
            ("does coffee have caffeine",),
            ("is a strawberry red",),
            ("does the earth orbit the sun",),
            ("can elephants recognize themselves in a mirror",),
            ("is it legal to own a hedgehog in texas",),
            ("should i wear sunscreen when it's cloudy",),
            ("are carrots good for your eyesight",),
            ("is shakespeare still famous",),
        ),
    ),
    (
        "ans-no",
        (
            ("can pigs fly",),
            ("is the moon made of cheese",),
            ("do snakes have legs",),
            ("is a whale a fish",),
            ("can humans breathe underwater",),
            ("is a spider an insect",),
            ("do penguins fly", "can a penguin fly"),
            ("is zero an odd number",),
            ("is the great wall visible from space",),
            ("are you a human", "are you a real person"),
            ("is a peanut a nut",),
            ("do ostriches bury their heads",),
            ("is bigfoot real",),
            ("can cats taste sweet things",),
            ("did vikings wear horned helmets",),
            ("is glass a liquid",),
            ("do bulls hate red",),
            ("is mount everest in europe",),
            ("can you microwave aluminum foil",),
            ("is it raining on mars",),
            ("are koalas bears",),
            ("does lightning never strike twice",),
            ("is venus the closest planet to the sun",),
            ("should i leave the oven on overnight",),
            ("did einstein fail math at school",),
            ("can goldfish live in tap water without treatment",),
            ("are sharks mammals",),
            ("is a tomato a vegetable",),
        ),
    ),
    (
        "ans-number-4",
        (
            ("what is two plus two", "what's two plus two", "two plus two"),
            ("how many legs does a dog have",),
            ("how many seasons are there", "number of seasons in a year"),
            ("what's the square root of sixteen",),
            ("how many strings on a violin",),
            ("how many chambers in the human heart",),
            ("how many quarters make a dollar",),
            ("what is eight divided by two",),
            ("how many beatles were there",),
            ("how many wheels does a car have",),
            ("how many suits in a deck of cards",),
            ("how often is a leap year",),
            ("what's ten minus six",),
            ("how many nucleotide bases in dna",),
            ("how many teenage mutant ninja turtles",),
            ("how many gospels are in the bible",),
            ("how many stomachs does a cow have",),
            ("how many presidents on mount rushmore",),
            ("what is one times four",),
            ("what comes after three",),
            ("sides on a square",),
            ("a square has how many corners",),
            ("what is the sum of one and three",),
            ("what do you get if you double two",),
            ("how many tires should i buy for my truck",),
            ("how many horsemen of the apocalypse",),
        ),
    ),
    (
        "ans-number-12",
        (
            ("how many months in a year", "number of months in a year"),
            ("how many inches in a foot",),
            ("what is three times four", "three times four"),
            ("how many eggs in a dozen",),
            ("how many signs of the zodiac",),
            ("how many apostles did jesus have",),
            ("how many numbers on a clock face",),
            ("what is seven plus five",),
            ("how many semitones in an octave",),
            ("how many pairs of ribs do people have",),
            ("how many days of christmas are there",),
            ("how many astronauts walked on the moon",),
            ("what is twenty four divided by two",),
            ("how many jurors sit on a jury",),
            ("how many olympian gods",),
            ("how many labours of hercules",),
            ("how many tribes of israel",),
            ("how many grades in school",),
            ("what's fifteen minus three",),
            ("what's a dozen",),
            ("which number follows eleven",),
            ("what is the sum of five and seven",),
            ("what do you get if you multiply six by two",),
            ("a foot equals how many inches",),
            ("pencils in a standard box",),
        ),
    ),
    (
        "ans-number-7",
        (
            ("how many continents are there", "number of continents"),
            ("how many days in a week",),
            ("how many colors in a rainbow", "how many colours does a rainbow have"),
            ("how many wonders of the ancient world",),
            ("how many dwarfs did snow white meet",),
            ("what is three plus four",),
            ("how many notes in a major scale",),
            ("how many harry potter books are there",),
            ("how many deadly sins",),
            ("how many seas did sailors sail",),
            ("what's fourteen divided by two",),
            ("how many bones in a giraffe neck",),
            ("how many hills is rome built on",),
            ("how many players on a netball court",),
            ("how many chakras",),
            ("how many spots on a ladybug",),
            ("what is forty nine divided by seven",),
            ("how many samurai in the film",),
            ("what comes after six",),
            ("what is the sum of two and five",),
            ("a week has how many days",),
            ("lucky number in most cultures",),
            ("what's twenty one divided by three",),
            ("seven plus zero equals",),
        ),
    ),
    (
        "ans-i-dont-know",
        (
            ("what is the meaning of life",),
            ("why is my cat staring at me",),
            ("what am i thinking", "guess what i'm thinking"),
            ("what will the lottery numbers be",),
            ("where did i leave my keys", "have you seen my keys"),
            ("who will win the next election",),
            ("what should i name my goldfish",),
            ("why do i always lose socks",),
            ("does my neighbor like me",),
            ("what's at the end of the universe",),
            ("how many grains of sand are on earth",),
            ("when will i get married",),
            ("is there life after death",),
            ("why is my wifi so slow",),
            ("what did my boss mean by that",),
            ("will it snow on my birthday next year",),
            ("who ate the last cookie",),
            ("what's my dog dreaming about",),
            ("how do i become famous overnight",),
            ("which came first the chicken or the egg",),
            ("what color is my shirt",),
            ("tell me a secret nobody knows",),
            ("can you predict tomorrow's stock market",),
            ("what happened to amelia earhart",),
        ),
    ),
)

GENERIC_ANSWER_IDS: tuple[str, ...] = tuple(answer_id for answer_id, _ in _GENERIC)

# Misheard words: homophones and near-homophones an ASR model confuses, plus misspelled names.
CONFUSIONS: Mapping[str, tuple[str, ...]] = {
    "weather": ("whether",),
    "two": ("to", "too"),
    "to": ("two",),
    "four": ("for",),
    "for": ("four",),
    "capital": ("capitol",),
    "there": ("their",),
    "wrote": ("rote",),
    "write": ("right",),
    "won": ("one",),
    "eight": ("ate",),
    "hour": ("our",),
    "sea": ("see",),
    "whole": ("hole",),
    "week": ("weak",),
    "sun": ("son",),
    "rain": ("reign",),
    "new": ("knew",),
    "high": ("hi",),
    "tall": ("toll",),
    "boil": ("boyle",),
    "flu": ("flew",),
    "meat": ("meet",),
    "flour": ("flower",),
    "pair": ("pear",),
    "mars": ("mar's",),
    "pisa": ("pizza",),
    "giza": ("geezer",),
    "eiffel": ("eiffle", "i fell"),
    "kilimanjaro": ("kilimanjero",),
    "reykjavik": ("rekyavik", "wreck a vick"),
    "kathmandu": ("katmandu",),
    "beyonce": ("beyonse", "beyond say"),
    "rihanna": ("rianna",),
    "lebron": ("le bron",),
    "keanu": ("kiano",),
    "messi": ("messy",),
    "hermione": ("her my oni",),
    "gandalf": ("gandolf",),
    "schadenfreude": ("shaden freud",),
    "ubiquitous": ("ubiquitis",),
    "nvidia": ("invidia",),
    "hanukkah": ("chanukah",),
    "diwali": ("devali",),
    "quinoa": ("keen wa",),
    "mcdonalds": ("mac donalds",),
    "tchaikovsky": ("chaikovsky",),
    "mississippi": ("missisippi",),
    "uluru": ("ooloo roo",),
    "sydney": ("sidney",),
    "taylor": ("tailor",),
    "seattle": ("seatle",),
    "zanzibar": ("zanzabar",),
    "machu": ("macho",),
    "picchu": ("pichu",),
    "zeitgeist": ("zeit guys",),
    "hygge": ("hoo ga",),
    "celsius": ("celcius",),
    "fahrenheit": ("farenheit",),
    "shakira": ("shakeera",),
    "nineteen": ("ninety",),
}

_LOCALES = (("en-US", 62), ("en-GB", 16), ("en-IN", 12), ("en-AU", 6), ("en-CA", 4))
_DEVICES = (("speaker", 52), ("phone", 28), ("car", 10), ("tv", 7), ("watch", 3))
# Requests per hour of the (UTC) day: quiet nights, morning and evening peaks.
_HOURLY = (2, 1, 1, 1, 1, 2, 5, 9, 10, 8, 7, 7, 8, 7, 6, 6, 7, 8, 9, 10, 10, 9, 6, 4)
_FILLERS = ("um", "uh", "hey", "so", "okay")

GENERIC_SHARE = 0.10  # of all requests, spread evenly over the generic answers
FALSE_NEGATIVE_RATE = 0.02
EMPTY_RATE = 0.004  # ASR returned nothing
DUPLICATE_RATE = 0.003  # client retry: the same line logged twice
REPHRASE_RATE = 0.18  # next request in a session is the same intent, worded differently
UNIFORM_FLOOR = 0.25  # mixed into Zipf so that even the rarest intent shows up every few days
SECONDS_PER_DAY = 86_400


# --------------------------------------------------------------------------------------
# The catalogue
# --------------------------------------------------------------------------------------


def _fill(family: _Family, slot: str) -> dict[str, str]:
    values = dict(zip(family.keys, slot.split("|"), strict=True))
    for key, value in list(values.items()):
        values[f"a_{key}"] = ("an " if value[0] in "aeiou" else "a ") + value
    if "x" in values:
        x = values["x"]
        for article in ("the ", "a ", "an "):
            if x.startswith(article):
                x = x[len(article) :]
                break
        values["bare"] = x
    return values


def max_intents() -> int:
    """How many non-generic intents the embedded templates can produce."""
    return sum(len(family.slots) for family in _FAMILIES)


@lru_cache(maxsize=8)
def _catalogue(intents: int, seed: int) -> tuple[Intent, ...]:
    if not 1 <= intents <= max_intents():
        raise ValueError(f"intents must be between 1 and {max_intents()}, got {intents}")
    # Each family's slot order is shuffled by its own generator (seeded by the family name,
    # not its position) and intents are dealt round-robin across families, so every topic
    # is present even for small `intents` and a smaller catalogue is a prefix of a larger one.
    shuffled = []
    for family in _FAMILIES:
        slots = list(family.slots)
        random.Random(f"{seed}:slots:{family.name}").shuffle(slots)
        shuffled.append(slots)
    chosen: list[tuple[_Family, str]] = []
    for rank in range(max(len(s) for s in shuffled)):
        for family, slots in zip(_FAMILIES, shuffled, strict=True):
            if rank < len(slots):
                chosen.append((family, slots[rank]))
    chosen = chosen[:intents]

    # Zipf (exponent 1) over a seeded permutation of the intents, scaled by family popularity.
    # Only +, * and / here and below: they round identically on every IEEE machine, whereas
    # libm's pow/log/cos may differ in the last bit between platforms and flip a draw.
    order = list(range(intents))
    random.Random(f"{seed}:popularity:{intents}").shuffle(order)
    zipf = [0.0] * intents
    for rank, index in enumerate(order):
        zipf[index] = chosen[index][0].popularity / (rank + 1)
    zipf_total = sum(zipf)
    normal_share = 1.0 - GENERIC_SHARE
    weights = [
        normal_share * ((1 - UNIFORM_FLOOR) * z / zipf_total + UNIFORM_FLOOR / intents)
        for z in zipf
    ]

    answer_ids = [f"ans-{i:05d}" for i in range(intents)]
    by_family: dict[str, list[int]] = {}
    for i, (family, _) in enumerate(chosen):
        by_family.setdefault(family.name, []).append(i)
    result: list[Intent] = []
    for i, (family, slot) in enumerate(chosen):
        # Related = the next intent of the same family ("how tall is big ben" answered with
        # the height of the eiffel tower): that is where real mis-routed answers land.
        siblings = by_family[family.name]
        related = None
        if len(siblings) > 1:
            related = answer_ids[siblings[(siblings.index(i) + 1) % len(siblings)]]
        values = _fill(family, slot)
        result.append(
            Intent(
                answer_id=answer_ids[i],
                family=family.name,
                topic=family.topic,
                paraphrases=tuple(t.format(**values) for t in family.templates),
                related=related,
                weight=weights[i],
            )
        )
    for answer_id, questions in _GENERIC:
        result.append(
            Intent(
                answer_id=answer_id,
                family="generic",
                topic="generic",
                paraphrases=tuple(p for phrasings in questions for p in phrasings),
                related=None,
                weight=GENERIC_SHARE / len(_GENERIC),
                generic=True,
            )
        )
    return tuple(result)


def intent_catalogue(intents: int, seed: int) -> list[Intent]:
    """The `intents` answer intents (ids ans-00000 ...) followed by the generic answers.

    Deterministic in (intents, seed); the first k normal intents are the same for any
    `intents >= k` (their popularity weights differ).
    """
    return list(_catalogue(intents, seed))


# --------------------------------------------------------------------------------------
# Noise
# --------------------------------------------------------------------------------------


def _misheard(words: list[str], rng: random.Random) -> None:
    spots = [i for i, w in enumerate(words) if w in CONFUSIONS]
    if spots:
        for i in rng.sample(spots, k=1 if len(spots) == 1 or rng.random() < 0.75 else 2):
            words[i] = rng.choice(CONFUSIONS[words[i]])


def _asr_noise(text: str, rng: random.Random) -> str:
    """A clean question as a speech recogniser might have transcribed it."""
    words = text.split()
    if rng.random() < 0.10:
        _misheard(words, rng)
    roll = rng.random()
    if roll < 0.05 and len(words) >= 4:
        # The end-pointer cut the user off: the last word or two are gone, sometimes mid-word.
        del words[-rng.randint(1, 2) :]
        if rng.random() < 0.2 and len(words[-1]) > 4:
            words[-1] = words[-1][: rng.randint(2, len(words[-1]) - 2)]
    elif roll < 0.10 and len(words) >= 4:
        del words[rng.randrange(1, len(words))]
    if rng.random() < 0.03:
        words.insert(0, rng.choice(_FILLERS))
    if rng.random() < 0.12:
        # Many recognisers drop the apostrophe: "what's" -> "whats".
        words = [w.replace("'", "") for w in words]

    style = rng.random()
    if style < 0.10:
        words[0] = words[0].capitalize()
    elif style < 0.12:
        n = rng.randint(1, min(2, len(words)))
        words[:n] = [w.upper() for w in words[:n]]
    elif style < 0.14:
        i = rng.randrange(len(words))
        words[i] = words[i].capitalize()
    elif style < 0.15:
        words = [w.upper() for w in words]
    question = " ".join(words)
    if rng.random() < 0.05:
        question += "?"
    return question


# --------------------------------------------------------------------------------------
# One day
# --------------------------------------------------------------------------------------


def _cumulative(weights: Sequence[float]) -> list[float]:
    return list(itertools.accumulate(weights))


@lru_cache(maxsize=8)
def _day_tables(intents: int, seed: int) -> tuple[tuple[Intent, ...], list[float]]:
    catalogue = _catalogue(intents, seed)
    return catalogue, _cumulative([intent.weight for intent in catalogue])


def _pick(cum: Sequence[float], rng: random.Random) -> int:
    return min(bisect_right(cum, rng.random() * cum[-1]), len(cum) - 1)


_TEMPLATE_CUM: dict[int, list[float]] = {}
_LOCALE_CUM = _cumulative([w for _, w in _LOCALES])
_DEVICE_CUM = _cumulative([w for _, w in _DEVICES])
_HOUR_CUM = _cumulative(_HOURLY)


def _template_index(n: int, rng: random.Random) -> int:
    # Users favour the plainest wording: template j is drawn with weight 1/(j+1).
    cum = _TEMPLATE_CUM.get(n)
    if cum is None:
        cum = _TEMPLATE_CUM[n] = _cumulative([1.0 / (j + 1) for j in range(n)])
    return _pick(cum, rng)


def _confidence(rng: random.Random, noisy: bool) -> float:
    # A bell shape from a sum of uniforms (random.gauss calls libm's log and cos), then integer
    # thousandths and one division: the float and its repr are the same on every machine.
    base = 0.93 - (0.25 if noisy else 0.0)
    spread = 0.06 * (rng.random() + rng.random() + rng.random() - 1.5) * 2
    milli = round(1000 * (base + spread))
    return max(0, min(1000, milli)) / 1000


def generate_day(day: date, *, seed: int, rows: int, intents: int) -> list[dict[str, Any]]:
    """The logged requests of one day, sorted by time (exactly `rows` rows).

    Each row is a dict with the keys of `FIELDS`, in that order.
    """
    if rows < 0:
        raise ValueError(f"rows must be >= 0, got {rows}")
    catalogue, cum = _day_tables(intents, seed)
    rng = random.Random(f"{seed}:{day.isoformat()}")
    day_prefix = day.isoformat()
    out: list[tuple[int, int, dict[str, Any]]] = []
    # (second, question, answer_id) already logged: two users asking the same thing in the
    # same second would look like a client retry to the cleaner, which must count only real ones.
    logged: set[tuple[int, str, str]] = set()

    def log_row(second: int, who: tuple[str, str, str], question: str, answer_id: str) -> None:
        while (second, question, answer_id) in logged:
            second = second + 1 if second < SECONDS_PER_DAY - 1 else second - 1
        logged.add((second, question, answer_id))
        if not question.strip():
            confidence = rng.randrange(0, 200) / 1000
        else:
            confidence = _confidence(rng, noisy=question.lower().rstrip("?") != clean)
        hh, rest = divmod(second, 3600)
        mm, ss = divmod(rest, 60)
        session, locale, device = who
        row = {
            "timestamp": f"{day_prefix}T{hh:02d}:{mm:02d}:{ss:02d}Z",
            "request_id": f"{rng.getrandbits(64):016x}",
            "session_id": session,
            "locale": locale,
            "device": device,
            "question": question,
            "answer_id": answer_id,
            "confidence": confidence,
        }
        out.append((second, len(out), row))
        if len(out) < rows and rng.random() < DUPLICATE_RATE:
            out.append((second, len(out), dict(row)))

    while len(out) < rows:
        # A session: one user on one device asking one or more questions in a row.
        who = (
            f"{rng.getrandbits(48):012x}",
            _LOCALES[_pick(_LOCALE_CUM, rng)][0],
            _DEVICES[_pick(_DEVICE_CUM, rng)][0],
        )
        second = 3600 * _pick(_HOUR_CUM, rng) + rng.randrange(3600)
        turns = 1
        while turns < 8 and rng.random() < 0.38:
            turns += 1
        intent: Intent | None = None
        template = -1
        for _ in range(min(turns, rows - len(out))):
            if intent is not None and not intent.generic and rng.random() < REPHRASE_RATE:
                # The user was not happy with the answer and asks again in other words.
                n = len(intent.paraphrases)
                template = (template + rng.randrange(1, n)) % n
            else:
                intent = catalogue[_pick(cum, rng)]
                if intent.generic:
                    # Unrelated questions, none of them a "plain wording" of the others.
                    template = rng.randrange(len(intent.paraphrases))
                else:
                    template = _template_index(len(intent.paraphrases), rng)
            clean = intent.paraphrases[template]
            if rng.random() < EMPTY_RATE:
                # ASR failure: nothing (or only whitespace) recognised; the fallback answers.
                log_row(second, who, rng.choice(("", " ", "  ", "\t")), "ans-i-dont-know")
            else:
                answer_id = intent.answer_id
                if intent.related is not None and rng.random() < FALSE_NEGATIVE_RATE:
                    answer_id = intent.related
                log_row(second, who, _asr_noise(clean, rng), answer_id)
            # Mostly a few seconds between turns, sometimes a minute (no libm: see _catalogue).
            second = min(SECONDS_PER_DAY - 1, second + 4 + int(64 * rng.random() * rng.random()))
    out.sort(key=lambda item: (item[0], item[1]))
    return [row for _, _, row in out]


def _render(rows: Sequence[Mapping[str, Any]]) -> bytes:
    return "".join(
        json.dumps({key: row[key] for key in FIELDS}, ensure_ascii=False) + "\n" for row in rows
    ).encode("utf-8")


def write_day(out_dir: Path, day: date, *, seed: int, rows: int, intents: int) -> Path:
    """Write one day's log to `<out_dir>/YYYY-MM-DD.jsonl` and return its path.

    The file is written atomically (`qpr.io`), so a reader never sees half a day.
    """
    path = Path(out_dir) / f"{day.isoformat()}.jsonl"
    return write_bytes_atomic(
        path, _render(generate_day(day, seed=seed, rows=rows, intents=intents))
    )


def write_logs(
    out_dir: Path, spec: SynthSpec, progress: Callable[[int, int], None] | None = None
) -> list[Path]:
    """Write `spec.days` daily files from `spec.start`; `progress(done, total)` after each."""
    if spec.days < 0:
        raise ValueError(f"days must be >= 0, got {spec.days}")
    paths = []
    for offset in range(spec.days):
        day = spec.start + timedelta(days=offset)
        paths.append(
            write_day(out_dir, day, seed=spec.seed, rows=spec.rows_per_day, intents=spec.intents)
        )
        if progress is not None:
            progress(offset + 1, spec.days)
    return paths
