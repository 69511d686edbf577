"""Seeded, deterministic workloads shared by the benchmarks.

`no_reuse_workload` is the no-reuse control of DESIGN.md "Measuring": token-id prompts cut from varied
English text, so requests share no prefix beyond chance (each prompt starts at a random word inside a
random sentence and continues with other sentences in random order).
"""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

SENTENCES = [
    "The harbor was quiet in the early morning, and the fishing boats rocked gently against the pier.",
    "Most people underestimate how much a small change in daily habits can add up over a year.",
    "She opened the old notebook and found a recipe for bread written in her grandmother's careful hand.",
    "The committee agreed to postpone the vote until the financial report had been reviewed by an auditor.",
    "Photosynthesis converts light energy into chemical energy that plants store in the form of sugar.",
    "When the train finally arrived, it was forty minutes late and every seat was already taken.",
    "A good database index can turn a query that takes minutes into one that finishes in milliseconds.",
    "The museum's new exhibit traces the history of navigation from star charts to satellite positioning.",
    "He argued that the city should invest in bicycle lanes before widening any more roads.",
    "Glaciers carve deep valleys as they move, grinding rock into fine powder called glacial flour.",
    "Our quarterly results show steady growth in subscriptions, although hardware sales declined slightly.",
    "If you water tomato plants in the evening, the leaves stay damp overnight and mold can spread.",
    "The novel follows three generations of a family who run a small hotel on the edge of the desert.",
    "Before signing the lease, read the clause about repairs and ask who pays for broken appliances.",
    "The orchestra tuned their instruments while the audience slowly found their seats in the dim hall.",
    "Volcanic soil is often very fertile, which is why farms cling to the slopes of active mountains.",
    "The software update fixed the login bug but introduced a new problem with push notifications.",
    "Children learn languages faster when they hear them spoken in everyday situations at home.",
    "The bridge was designed to sway slightly in strong winds rather than resist them rigidly.",
    "A cup of strong coffee and a quiet hour before work is how many writers protect their focus.",
    "Researchers tracked the migration of monarch butterflies across thousands of miles of open land.",
    "The recipe calls for two cups of flour, a pinch of salt, and butter that is cold from the fridge.",
    "During the storm, the power went out across the valley and the roads were closed by fallen trees.",
    "Interest rates affect everything from mortgage payments to the price companies pay to borrow money.",
    "The hikers reached the summit just after noon and ate their sandwiches while watching the clouds.",
    "Every time the printer jams, someone has to open three panels and pull out a crumpled sheet.",
    "The ancient city was built on a grid, with wide avenues leading to a central market square.",
    "Sleep plays a key role in memory, as the brain replays and consolidates what it learned that day.",
    "The startup pivoted twice before finding customers who were willing to pay for its product.",
    "In the spring the river floods the low fields, leaving behind a layer of rich dark silt.",
    "Please make sure the meeting notes are shared with everyone who could not attend on Thursday.",
    "The detective noticed that the clock on the mantel had stopped at exactly a quarter past nine.",
    "Solar panels produce the most electricity around midday, when the sun is highest in the sky.",
    "My neighbor has been building a wooden canoe in his garage for almost three years now.",
    "The teacher asked the students to explain the experiment in their own words before the test.",
    "Supply chains became fragile when factories around the world closed at the same time.",
    "The lighthouse keeper wrote in the logbook every evening, noting the weather and passing ships.",
    "Regular exercise improves mood, lowers blood pressure, and helps people sleep more soundly.",
    "The city council published a plan to plant ten thousand trees along its busiest streets.",
    "Compilers translate source code into machine instructions, optimizing loops and removing dead code.",
    "On the third day of the festival, the rain stopped and the field filled with music and dancing.",
    "The manager explained that refunds take five to seven business days to appear on a statement.",
    "Wolves were reintroduced to the park, and within a decade the rivers changed their course.",
    "The bakery on the corner sells out of croissants by nine o'clock almost every morning.",
    "A balanced diet includes vegetables, whole grains, protein, and a modest amount of healthy fat.",
    "The spacecraft sent back images of a frozen moon covered in long cracks and ridges of ice.",
    "He spent the afternoon sorting old photographs into boxes labeled by year and by place.",
    "Negotiations broke down when neither side was willing to compromise on the delivery schedule.",
    "The garden path was lined with lavender, and bees moved slowly from one flower to the next.",
    "Encryption protects data in transit, but it cannot help if the password itself is stolen.",
    "The village held a meeting to decide whether the old school should become a library.",
    "Astronomers measure the distance to nearby stars by watching how they shift as the earth moves.",
    "After the concert, the band stayed to sign albums and talk with fans for almost an hour.",
    "The insurance form asks for the date of the accident, the names of witnesses, and a police report.",
    "Coral reefs support a quarter of all marine species while covering a tiny fraction of the ocean.",
    "She practiced the piano piece every evening until she could play it without looking at the score.",
    "The company plans to hire twenty engineers next year to expand its cloud infrastructure team.",
    "Autumn arrived early that year, and the maple trees turned red before the end of September.",
    "To reset the device, hold the power button for ten seconds until the light blinks twice.",
    "The historian argued that the war was decided less by battles than by the harvests of two summers.",
]


@dataclass(frozen=True, slots=True)
class BenchRequest:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int


def english_text(rng: random.Random, min_words: int) -> str:
    """Sentences in random order, starting at a random word of the first one."""
    order = rng.sample(SENTENCES, len(SENTENCES))
    first = order[0].split()
    words = first[rng.randrange(len(first) - 3):]
    i = 1
    while len(words) < min_words:
        words += order[i % len(order)].split()
        i += 1
        if i % len(order) == 0:
            rng.shuffle(order)
    return " ".join(words)


def no_reuse_workload(encode: Callable[[str], list[int]], num_requests: int, prompt_len: tuple[int, int],
                      max_tokens: tuple[int, int], seed: int = 0) -> list[BenchRequest]:
    """`num_requests` requests; prompt lengths and max_tokens drawn uniformly (inclusive) from the ranges."""
    rng = random.Random(seed)
    out = []
    for i in range(num_requests):
        n = rng.randint(*prompt_len)
        m = rng.randint(*max_tokens)
        ids = encode(english_text(rng, min_words=n))  # a word is >= 1 token, so this is long enough
        out.append(BenchRequest(f"req-{i}", ids[:n], m))
    return out


def greedy_agreement(outputs: list[list[int]], reference: list[list[int]]) -> tuple[float, float]:
    """How far greedy outputs agree with a reference, request by request: (share of tokens before each
    request's first difference, share of requests identical throughout)."""
    same = total = whole = 0
    for out, ref in zip(outputs, reference, strict=True):
        n = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
        same += n
        total += max(len(out), len(ref))
        whole += out == ref
    return same / total, whole / len(outputs)
