"""The phases of one GRPO step, named once: the estimator's phases and the probes' labels are these.

TRL 1.16's step (`GRPOTrainer.training_step` -> `_generate_and_score_completions` -> `compute_loss` ->
optimizer step): generation, the no-grad log-prob passes, the training forward + backward, the optimizer step.
"""

GENERATE = "generate"
SCORE = "score"
TRAIN = "train"
OPTIMIZER = "optimizer"
PHASES = (GENERATE, SCORE, TRAIN, OPTIMIZER)
PHASE_HELP = {
    GENERATE: "generation: KV cache and last-token logits (no grad)",
    SCORE: "no-grad log-prob passes (reference / old policy), chunked by per_device_train_batch_size",
    TRAIN: "training forward + backward of one micro-batch",
    OPTIMIZER: "optimizer step",
}
