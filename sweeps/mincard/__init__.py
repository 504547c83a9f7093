"""The smallest card, measured: per configuration, the smallest torch memory limit its GRPO steps pass under."""
