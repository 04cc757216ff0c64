"""Model code (GPT family) and tokenizer training."""
