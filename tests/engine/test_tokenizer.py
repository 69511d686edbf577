"""engine/tokenizer.py: the default model's folder names the generic fast tokenizer, which loads
without AutoTokenizer's detour through the model config (and torch); it must be the very tokenizer
AutoTokenizer gives: the same ids, chat template and text. An ingress replica, which tokenizes but
never runs the model, then starts without importing torch, as do the other processes that only hold
node handles (docs/architecture.md)."""
from __future__ import annotations

import subprocess
import sys

from raypd.engine.model.source import resolve_model
from raypd.engine.tokenizer import GENERIC_FAST, Tokenizer, declared_class
from tests.prompts import CHAT_PROMPTS, RAW_PROMPTS


def test_the_direct_load_is_what_autotokenizer_gives():
    from transformers import AutoTokenizer

    folder = resolve_model(None)
    assert declared_class(folder) in GENERIC_FAST
    ours, auto = Tokenizer(folder), AutoTokenizer.from_pretrained(str(folder))
    assert type(ours.hf) is type(auto)
    for text in RAW_PROMPTS:
        ids = ours.encode(text)
        assert ids == auto.encode(text, add_special_tokens=True)
        assert ours.decode(ids) == auto.decode(ids, skip_special_tokens=True)
    for messages in CHAT_PROMPTS:
        text = auto.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert ours.apply_chat_template(messages) == auto.encode(text, add_special_tokens=False)


def test_the_declared_class_is_the_name_the_folder_gives_or_none(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "Qwen2Tokenizer"}')
    assert declared_class(tmp_path) == "Qwen2Tokenizer" and declared_class(tmp_path / "nowhere") is None
    (tmp_path / "tokenizer_config.json").write_text("[not json")
    assert declared_class(tmp_path) is None


def test_the_processes_that_hold_node_handles_load_without_torch():
    """The ingress with its tokenizer, and every node class: Ray imports an actor's class in every
    process that deserializes its handle (the serve driver, the ingress, the NodePool, the Conductor)."""
    code = ("import sys; import raypd.cluster.serve.ingress, raypd.cluster.serve.node_pool, raypd.conductor.actor; "
            "import raypd.prefill_node.prefill_node, raypd.decode_node.decode_node, raypd.flex_node.flex_node; "
            "import raypd.node.mixed_node; from raypd.engine.tokenizer import Tokenizer; "
            "from raypd.engine.model.source import resolve_model; Tokenizer(resolve_model(None)).encode('hi'); "
            "print(sorted(m for m in ('torch', 'transformers.models.llama') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
