"""`custom_prompts.v<n>`: the prompts people saved from Podium, as a benchmark pinned to one version.

Version v<n> of `podium.custom_prompts` is read (a pinned table version, so the prompts of a
benchmark never change); every prompt is completed greedily, and the score is the share of
completions that are Python or a valid start of it (the test `python_sanity` uses). Every
completion goes into the result's details, beside its prompt and note, so a checkpoint's answers
to the prompts someone flagged can be read in the evaluation and compared across checkpoints.
"""

from __future__ import annotations

import re

from factory.errors import ConfigError
from factory.evals.base import Benchmark, EvalInputs, Score

NAME = re.compile(r"custom_prompts\.(v\d+)")
NEW_TOKENS = 48
DETAIL_CHARS = 400


def custom_benchmark(name: str) -> Benchmark | None:
    """The benchmark a name such as `custom_prompts.v3` stands for, or None for other names."""
    match = NAME.fullmatch(name)
    if match is None:
        return None
    tag = match.group(1)
    ref = f"podium.custom_prompts@{tag}"
    return Benchmark(
        name=name, version=1, lower_is_better=False, run=lambda inputs: custom_prompts(inputs, tag), data=ref,
        description=f"greedy completions ({NEW_TOKENS} tokens) of the prompts saved in {ref}: "
                    "the share that are Python or a valid start of it; every completion in the details",
    )


def custom_prompts(inputs: EvalInputs, tag: str) -> Score:
    """Complete every prompt of the pinned version; the share of completions that are (the start of) Python."""
    # Imported here, so that `factory check` resolves the name without torch.
    from factory.data.prompts import TABLE, read_prompts
    from factory.evals.sanity import valid_sample
    from factory.models.generate import generate
    from factory.models.sampling import Sampling

    if inputs.catalog is None:
        raise ConfigError("the custom_prompts benchmark needs the Iceberg catalog; it was not given one")
    if inputs.context <= NEW_TOKENS:
        raise ConfigError(f"custom_prompts needs a context above {NEW_TOKENS} tokens; the model has {inputs.context}")
    prompts = read_prompts(inputs.catalog, tag)
    if not prompts:
        raise ConfigError(f"{TABLE}@{tag} holds no prompts; save some from Podium first")
    encoded = [inputs.tokenizer.encode(p["prompt"]).ids[-(inputs.context - NEW_TOKENS):] or [inputs.eos_id] for p in prompts]
    sampling = Sampling(new_tokens=NEW_TOKENS, eos_id=inputs.eos_id)
    done = generate(inputs.model, encoded, sampling, context=inputs.context, batch_size=inputs.batch_size)
    completions: dict[int, tuple[str, bool]] = {}
    for i, completion in enumerate(done):
        finished = completion.finish == "eos"
        text = inputs.tokenizer.decode(list(completion.text_tokens))
        completions[i] = (text, valid_sample(prompts[i]["prompt"] + text, finished=finished))
    valid = sum(ok for _, ok in completions.values())
    answers = [{"prompt": p["prompt"][-DETAIL_CHARS:], "note": p["note"], "completion": completions[i][0], "python": completions[i][1]}
               for i, p in enumerate(prompts)]
    return Score(value=valid / len(prompts), count=len(prompts), details={"table": f"{TABLE}@{tag}", "valid": valid, "completions": answers})
