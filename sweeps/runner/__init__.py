"""One GRPO run per Hydra job: the app, the subprocess it starts, TRL setup, tiny models, GSM8K data."""
