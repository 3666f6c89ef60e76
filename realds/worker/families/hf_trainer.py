# The Hugging Face Trainer's tiny Llama (realds/README.md, "Hugging Face
# Trainer"): its runs are made by trainer_job.py, not by jobs.Job, so this family
# only gives the oracle what it merges with. The Trainer runs here at tp 1: every
# param whole on every rank.
import trainer_job

SPLITS = [(r".", None)]


def add_args(ap):
    trainer_job.add_args(ap)


def build(cfg, topo):
    raise SystemExit("the hf_trainer family runs under transformers' Trainer (worker/trainer_job.py), not jobs.Job")


def client_state(cfg, topo, iteration):
    return {}
