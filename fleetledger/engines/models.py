"""The model a vLLM shard serves: a local Hugging Face directory, or a tiny random Llama
built here.

No model can be downloaded on the machines this project is built on (and a test suite
that needs the network is one that fails at 3 a.m.), so with no ``--model`` a small
random Llama and a tokenizer trained on a few lines of text are built locally, with a
fixed seed, and cached: the same bytes on every machine, a second call is a directory
lookup. The trainer side loads the same directory with ``transformers``, which is what
lets a refit be checked by logprobs (the engine's against the trainer's forward pass).

Sizes are named presets: ``tiny`` (the default, ~1 MB, what tests and ``simulate`` use)
and ``200mb`` (~200 MB of float32, for the refit bench).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from fleetledger.errors import FleetledgerError

__all__ = ["MODEL_SIZES", "ModelError", "ModelSize", "cache_dir", "resolve_model", "tiny_llama"]

BUILD_VERSION = 1
"""Part of the cache key: bump it when what is built changes, so old caches are not used."""


class ModelError(FleetledgerError, ValueError):
    """A model directory that cannot be served (missing, or not a Hugging Face model)."""


@dataclass(frozen=True, slots=True)
class ModelSize:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    vocab_size: int = 512
    max_position_embeddings: int = 512


MODEL_SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        head_dim=32,
    ),
    "200mb": ModelSize(
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=4,
        num_attention_heads=16,
        head_dim=64,
    ),
}

# What the tokenizer is trained on: enough text for a few hundred merges, fixed, so the
# vocabulary is the same everywhere.
_CORPUS = [
    "the trainer pushes weights to every shard after each step",
    "a shard that dies is recorded dead and traffic moves to the rest",
    "probe results failures and refit outcomes are appended to the ledger",
    "one two three four five six seven eight nine ten eleven twelve",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 + - * / = ( )",
    "What is 2+2? The answer is 4. What is 3+5? The answer is 8.",
    "Hello, world! How are you today? I am fine, thank you.",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ .,;:!?'\"",
]


def cache_dir() -> Path:
    """``$FLEETLEDGER_CACHE_DIR``, else ``$XDG_CACHE_HOME/fleetledger``, else
    ``~/.cache/fleetledger``."""
    explicit = os.environ.get("FLEETLEDGER_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fleetledger"


def tiny_llama(size: str = "tiny", *, root: Path | None = None) -> Path:
    """The directory of a random Llama of preset ``size`` with its tokenizer, built once.

    Built into a temporary directory beside the cache and renamed into place, so a
    crash mid-build never leaves a half-written model that a later run would load.
    """
    if size not in MODEL_SIZES:
        raise ModelError(f"unknown model size {size!r}; expected one of {', '.join(MODEL_SIZES)}")
    shape = MODEL_SIZES[size]
    root = root or cache_dir() / "models"
    target = root / f"llama-{size}-v{BUILD_VERSION}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
    try:
        _build(staging, shape)
        try:
            staging.rename(target)
        except OSError:  # another process built it first: theirs is as good as ours
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _build(directory: Path, shape: ModelSize) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        _CORPUS * 4,
        trainers.BpeTrainer(
            vocab_size=shape.vocab_size,
            special_tokens=["<unk>", "<s>", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    config = LlamaConfig(
        **asdict(shape) | {"vocab_size": max(shape.vocab_size, len(tokenizer))},
        num_key_value_heads=shape.num_attention_heads,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)


def resolve_model(model: str | os.PathLike[str] | None) -> Path:
    """The directory to serve: ``model`` when given (it must hold a Hugging Face model),
    else the cached tiny Llama."""
    if model is None:
        return tiny_llama()
    path = Path(model)
    if not path.is_dir():
        raise ModelError(f"--model {model}: no such directory")
    if not (path / "config.json").is_file():
        raise ModelError(f"--model {model}: not a Hugging Face model directory (no config.json)")
    return path
