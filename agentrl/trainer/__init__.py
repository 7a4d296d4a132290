"""Training: TRL GRPOTrainer over the real runner, weight sync to the engine, evaluation, resume.

    config.py         TrainConfig (the job YAML)          rollouts.py       the rollout of each step (pipeline, store)
    trl_adapter/      everything that knows TRL           weight_sync.py    WeightSync: local / disk / adapter
    job.py            one training job, a step's order    steps.py          the step phases: metrics, eval, snapshots
    metrics.py        metrics.jsonl + per-step table      resume.py         cut the output dir back to a checkpoint
    eval.py           fixed-task-set evaluation + diff    checks.py         engine-vs-trainer start-up check
    loop.py           the background asyncio loop         checkpoints.py    resolve / LoRA-merge checkpoints to load
    dist.py           several ranks: rank 0 rolls out     mismatch.py       engine vs trainer logprobs per step
    trackers/         report_to: TensorBoard, W&B, trackio, MLflow fed every per-step metric (rank 0)

Import `agentrl.trainer.config` without the [train] extra; the rest needs trl, peft and datasets.
"""
