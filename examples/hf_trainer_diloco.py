"""Hugging Face Trainer + gossamer: DiLoCo on a tiny GPT-2, under torchrun.

    pip install 'gossamer[hf]'
    torchrun --standalone --nproc-per-node 2 examples/hf_trainer_diloco.py --steps 40 --local-steps 10

A character-level GPT-2 built from a config (no download) on a few thousand characters of Python's
own pydoc topics. The Trainer wraps the model in DDP; gossamer.integrations.DiLoCo, attached when
training begins (a TrainerCallback, once the Trainer has wrapped the model), makes DDP keep the
gradients local and runs the outer step every H inner AdamW steps. What a Trainer user must know:
- pass your own optimizer (``optimizers=(optimizer, None)``): DiLoCo hooks its ``step``;
- gradient accumulation: the hooks count optimizer steps, so H is in optimizer steps, not batches;
- mixed precision: a step the GradScaler skips (inf/NaN gradients) never calls ``optimizer.step``,
  so it neither counts nor syncs.
Rank 0 prints one JSON line: first and last training loss, outer steps, the smallest Ξ² between
outer steps (> 0: DDP kept the gradients local) and Ξ² at the end (0: the last step was an outer one).
"""

import argparse
import json

import torch
import torch.distributed as dist
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from gossamer.integrations import DiLoCo

CONTEXT = 32


def character_windows(text: str, vocabulary: str) -> list[dict]:
    """Consecutive windows of CONTEXT characters as token ids; the labels are the inputs (GPT-2
    shifts them)."""
    ids = torch.tensor([vocabulary.index(c) for c in text])
    return [{"input_ids": ids[i : i + CONTEXT], "labels": ids[i : i + CONTEXT]}
            for i in range(0, len(ids) - CONTEXT, CONTEXT // 2)]


class AttachDiLoCo(TrainerCallback):
    """Attach DiLoCo to the Trainer's DDP model and our optimizer when training begins."""

    def __init__(self, optimizer, outer_optimizer, local_steps: int):
        self.optimizer, self.outer_optimizer, self.local_steps = optimizer, outer_optimizer, local_steps
        self.trainer, self.sync, self.losses, self.between = None, None, [], []

    def on_train_begin(self, args, state, control, **kwargs):
        self.sync = DiLoCo(self.trainer.model_wrapped, self.optimizer, self.outer_optimizer,
                           local_steps=self.local_steps)

    def on_step_end(self, args, state, control, **kwargs):
        xi_sq = self.sync.consensus_distance()  # every rank: it is a collective
        if state.global_step % self.local_steps:
            self.between.append(xi_sq)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(logs["loss"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--local-steps", type=int, default=10)
    parser.add_argument("--out", default="runs/hf-trainer-diloco")
    args = parser.parse_args()

    from pydoc_data.topics import topics
    text = "".join(topics.values())[:6000]
    vocabulary = "".join(sorted(set(text)))
    torch.manual_seed(0)  # the same initial model in every process
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(vocabulary), n_positions=CONTEXT, n_embd=32, n_layer=1,
                                       n_head=2, bos_token_id=None, eos_token_id=None))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    attach = AttachDiLoCo(optimizer, outer, args.local_steps)
    training = TrainingArguments(output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=8,
                                 logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                                 ddp_backend="gloo", ddp_find_unused_parameters=False, disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=training, train_dataset=character_windows(text, vocabulary),
                      optimizers=(optimizer, None), callbacks=[attach])
    attach.trainer = trainer
    trainer.train()
    xi_sq = attach.sync.consensus_distance()
    if dist.get_rank() == 0:
        print(json.dumps({"first_loss": attach.losses[0], "last_loss": attach.losses[-1],
                          "outer_steps": attach.sync.comm.rounds, "min_xi_sq_between": min(attach.between),
                          "consensus_distance_sq": xi_sq}))


if __name__ == "__main__":
    main()
