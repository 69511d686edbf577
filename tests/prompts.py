"""Shared test prompts: raw text and chat messages, from a few tokens to several hundred, two of
them sharing a long prefix."""
from __future__ import annotations

ARTICLE = (
    "The lighthouse on the northern cape was built in 1874 by a small crew of stonemasons who sailed "
    "from the mainland every spring and left before the autumn gales. Its tower rises forty-one metres "
    "above the rocks, and its lamp, first fuelled by whale oil and later by paraffin, could be seen from "
    "twenty nautical miles on a clear night. For most of its working life the station was home to three "
    "keepers and their families. They kept a daily log of the weather, the ships that passed and the "
    "supplies that arrived by boat, and these logs, now kept in the regional archive, are a precise record "
    "of more than a century of storms. In 1912 a fire in the oil store destroyed the keepers' cottages, "
    "and the families lived for a whole winter in the tower itself, sleeping on the stairs between the "
    "watch room and the lantern. The cottages were rebuilt in brick the following year. Electricity came "
    "to the cape in 1956, and with it an automatic lamp that needed no one to trim its wick or wind its "
    "clockwork. The last keeper left in 1989. Since then the station has been looked after by a trust of "
    "volunteers who repaint the tower every seven years, guide visitors up its two hundred and twelve "
    "steps in summer, and record the birds that nest on the cliffs below: puffins, razorbills, fulmars "
    "and a colony of kittiwakes that has grown every year since the keepers' dogs were taken away. "
    "Scientists from the university use the old logbooks to study how the frequency of severe storms on "
    "this coast has changed, comparing the keepers' careful notes of wind and sea with modern satellite "
    "measurements, and they have found that the keepers' estimates of wave height were remarkably good."
)

RAW_PROMPTS = [
    "Hello",
    "The capital of France is",
    "List three colours:",
    "def fibonacci(n):",
    "Once upon a time, in a village at the edge of a great forest, there lived",
    ARTICLE + "\n\nQuestion: When was the lighthouse built?\nAnswer:",
    ARTICLE + "\n\nQuestion: Which birds nest on the cliffs?\nAnswer:",
    ARTICLE[:700] + " To summarise,",
]

CHAT_PROMPTS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "user", "content": "Write a short poem about the sea."}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "Explain what a lighthouse keeper did in two sentences."}],
    [{"role": "user", "content": "Summarise this text in one sentence:\n" + ARTICLE[:900]}],
]


def all_prompt_ids(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(p) for p in RAW_PROMPTS] + [tokenizer.apply_chat_template(m) for m in CHAT_PROMPTS]
