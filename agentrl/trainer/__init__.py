"""Training: TRL GRPOTrainer over the real runner (rollout_func), weight sync to the engine, evaluation, resume.

    config.py         TrainConfig (the job YAML)          rollout_func.py   TRL rollout_func + env_reward
    grpo.py           GRPOConfig mapping, trainer, IS shim weight_sync.py    WeightSync: local / disk / adapter
    job.py            one training job (order of things)  callbacks.py      per-step metrics / eval every K steps
    metrics.py        metrics.jsonl + per-step table      resume.py         cut the output dir back to a checkpoint
    eval.py           fixed-task-set evaluation + diff    checks.py         engine-vs-trainer start-up check
    loop.py           the background asyncio loop         checkpoints.py    resolve / LoRA-merge checkpoints to load
    dist.py           several ranks: rank 0 rolls out     mismatch.py       engine vs trainer logprobs per step
    trackers/         report_to: TensorBoard, W&B, trackio, MLflow fed every per-step metric (rank 0)

Import `agentrl.trainer.config` without the [train] extra; the rest needs trl, peft and datasets.
"""
