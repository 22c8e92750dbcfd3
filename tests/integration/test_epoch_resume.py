"""A resume from a checkpoint saved at an epoch boundary (verl issue #7401: verl's SFT trainer then skips the next
epoch and exits 0). verl 0.9.1's V1 trainer is not affected: its loop counts steps, not epochs, and its
``_fetch_one_gen_batch`` starts a fresh pass when the restored (exhausted) iterator stops at once. These tests
build the train dataloader as the V1 trainer does (verl's ``StatefulDataLoader``, ``create_rl_sampler``,
``collate_fn``, ``drop_last``), save its state after k steps as ``_save_checkpoint`` does, restore it into a fresh
one as ``_load_checkpoint`` does, and draw through verl's own ``_fetch_one_gen_batch``: a resumed run must draw
exactly the prompts the uninterrupted run drew, at a boundary, mid-epoch, shuffled or not. A verl whose resume
skips or repeats an epoch fails here."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

ROWS, BATCH = 8, 2  # four steps an epoch


class _Rows(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, index: int) -> dict:
        return {"row": torch.tensor(index), "raw_prompt": f"prompt {index}"}


def _train_dataloader(shuffle: bool):
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.trainer.ppo.utils import create_rl_sampler
    from verl.utils.dataset.rl_dataset import collate_fn

    data = OmegaConf.create({"shuffle": shuffle, "seed": 1, "sampler": None, "dataloader_num_workers": 0})
    return StatefulDataLoader(_Rows(), batch_size=BATCH, num_workers=0, drop_last=True, collate_fn=collate_fn,
                              sampler=create_rl_sampler(data, _Rows()))


class _Trainer:
    """What ``_fetch_one_gen_batch`` reads of verl's trainer."""

    def __init__(self, shuffle: bool) -> None:
        self.train_dataloader, self.train_dataloader_it = _train_dataloader(shuffle), None

    def draw(self) -> tuple[int, ...]:
        from verl.trainer.ppo.v1.trainer_base import PPOTrainer

        return tuple(int(row) for row in PPOTrainer._fetch_one_gen_batch(self)["row"])


def _draws(trainer: _Trainer, steps: int) -> list[tuple[int, ...]]:
    return [trainer.draw() for _ in range(steps)]


def test_unshuffled_steps_walk_the_rows_in_order_epoch_after_epoch():
    assert _draws(_Trainer(shuffle=False), 6) == [(0, 1), (2, 3), (4, 5), (6, 7), (0, 1), (2, 3)]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("saved_at", [1, 4, 6, 8], ids=["mid-first-epoch", "epoch-boundary", "mid-second-epoch",
                                                       "second-boundary"])
def test_a_resumed_run_draws_what_the_uninterrupted_run_draws(shuffle, saved_at):
    total = 12
    uninterrupted = _draws(_Trainer(shuffle), total)

    first = _Trainer(shuffle)
    _draws(first, saved_at)
    state = first.train_dataloader.state_dict()
    resumed = _Trainer(shuffle)
    resumed.train_dataloader.load_state_dict(state)

    assert _draws(resumed, total - saved_at) == uninterrupted[saved_at:]


def test_a_shuffled_epoch_draws_every_row_once_and_the_next_epoch_another_order():
    draws = _draws(_Trainer(shuffle=True), 8)
    first, second = [row for step in draws[:4] for row in step], [row for step in draws[4:] for row in step]
    assert sorted(first) == sorted(second) == list(range(ROWS))
    assert first != second
