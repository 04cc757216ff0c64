"""Model code: the built-in architecture (GPT), models built and exported through the architecture registry, and tokenizer training."""
