"""Generation sanity: the share of sampled continuations that are still Python.

`SAMPLES` samples of `NEW_TOKENS` tokens are drawn at `TEMPERATURE`, sample i from
`PROMPTS[i % len(PROMPTS)]` with its own generator seeded from the benchmark seed and i, so a
sample does not depend on the batch size or on which samples share its batch. A sample the model finished (it wrote EOS) must compile; an
unfinished one is cut after its last newline, since the token budget may end it mid-token, and
must be Python or the start of a Python program.
"""

from __future__ import annotations

import codeop
import warnings

from factory.evals.base import EvalInputs, Score
from factory.models.generate import generate
from factory.models.sampling import Sampling

# Statement heads that end on a visible character, where the byte-level BPE ends a pre-token, so
# the model starts from a token boundary it saw in training.
PROMPTS = (
    "import os", "from typing import", "def main():", "class Config:",
    "for item in items:", "with open(path) as f:", 'if __name__ == "__main__":', "@dataclass",
)
SAMPLES = 32
NEW_TOKENS = 96
TEMPERATURE = 0.8
EXAMPLES = 3
EXAMPLE_CHARS = 160


def valid_sample(text: str, *, finished: bool) -> bool:
    """Whether a finished `text` compiles, or an unfinished one is Python up to its last newline."""
    if not finished and "\n" in text:
        text = text[: text.rfind("\n") + 1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", (SyntaxWarning, DeprecationWarning))
        try:
            if finished:
                compile(text, "<sample>", "exec")
            else:
                codeop.compile_command(text, symbol="exec")
        except (SyntaxError, ValueError, OverflowError):
            return False
    return True


def python_sanity(inputs: EvalInputs) -> Score:
    """Share of seeded samples from fixed Python prompts that are valid Python (or a valid start of it)."""
    prompts = [inputs.tokenizer.encode(PROMPTS[i % len(PROMPTS)]).ids for i in range(SAMPLES)]
    sampling = Sampling(new_tokens=NEW_TOKENS, temperature=TEMPERATURE, eos_id=inputs.eos_id)
    seeds = [inputs.seed * SAMPLES + i for i in range(SAMPLES)]
    done = generate(inputs.model, prompts, sampling, context=inputs.context, seeds=seeds, batch_size=inputs.batch_size)
    samples: dict[int, tuple[str, bool]] = {}
    for i, completion in enumerate(done):
        finished = completion.finish == "eos"
        text = inputs.tokenizer.decode(prompts[i] + list(completion.text_tokens))
        samples[i] = (text, valid_sample(text, finished=finished))
    valid = sum(ok for _, ok in samples.values())
    examples = [{"text": samples[i][0][:EXAMPLE_CHARS], "valid": samples[i][1]} for i in range(EXAMPLES)]
    return Score(value=valid / SAMPLES, count=SAMPLES, details={"valid": valid, "samples": SAMPLES, "examples": examples})
