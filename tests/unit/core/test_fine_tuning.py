"""New users (held out of training) and their fine-tuning curve: fedper/fine_tuning.py, the held-out
split in fedper/data, recipes/new_users.py and ``fedper simulate --holdout-clients``."""

import dataclasses
import hashlib
import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedper import fine_tuning
from fedper._recipes.new_users import holdout_users
from fedper.cli import main
from fedper.common.errors import ConfigError
from fedper.common.train_config import TrainConfig
from fedper.common.weights import WeightsError
from fedper.data import DataConfig, DatasetError, load_dataset, load_federated, partition
from fedper.eager_trainer import EagerTrainer
from fedper.fine_tuning import (
    NewUser,
    curve_summary,
    fine_tune,
    fine_tuning_curve,
    majority_curve,
    personal_names,
    with_base,
)
from fedper.local_training import evaluate
from fedper.models import ModelConfig, build_model, exchanged_state, split
from fedper.models.heads import HEADS, classifier, rating_prior

SYNTH = DataConfig(dataset="aesthetic-synth", num_clients=4, users=8, images_per_user=(20, 40), seed=3)
MODEL = ModelConfig(num_classes=5, alpha=0.25, input_size=32)
TRAINING = TrainConfig(batch_size=8)


def _split_digest(fed) -> str:
    d = hashlib.sha256()
    for c in fed.clients:
        d.update(c.train.astype("int64").tobytes() + b"|" + c.test.astype("int64").tobytes() + b"#")
    return d.hexdigest()[:16]


@pytest.fixture(scope="module")
def synth():
    return load_dataset(SYNTH)


@pytest.fixture(scope="module")
def fed(synth):
    return partition(synth, DataConfig(**{**SYNTH.__dict__, "holdout_clients": 3}))


@pytest.fixture(scope="module")
def users(fed):
    return holdout_users(fed)


@pytest.fixture(scope="module")
def initial():
    torch.set_num_threads(1)
    return exchanged_state(build_model(MODEL, seed=3))


def test_holding_users_out_leaves_the_training_split_as_it_was(synth, fed):
    # Digest of the clients' indices for SYNTH at 1661431, before held-out users existed.
    assert _split_digest(partition(synth, SYNTH)) == "42e32d38aeaddf4d"
    assert _split_digest(fed) == "42e32d38aeaddf4d"
    assert partition(synth, SYNTH).holdout == ()


def test_held_out_users_are_whole_users_no_client_has(synth, fed):
    groups = synth.groups
    training = {int(g) for c in fed.clients for g in groups[np.concatenate([c.train, c.test])]}
    held = [np.unique(groups[np.concatenate([h.train, h.test])]) for h in fed.holdout]
    assert all(len(h) == 1 for h in held)  # one user each
    held_users = [int(h[0]) for h in held]
    assert len(set(held_users)) == 3 and not set(held_users) & training
    for h, user in zip(fed.holdout, held_users, strict=True):
        assert not set(h.train.tolist()) & set(h.test.tolist())
        assert sorted(np.concatenate([h.train, h.test]).tolist()) == np.flatnonzero(groups == user).tolist()
        assert len(h.test) == round(0.2 * (len(h.train) + len(h.test)))
    # The pool is in a seeded rating order (not the sorted one), the same for the same seed.
    again = partition(synth, DataConfig(**{**SYNTH.__dict__, "holdout_clients": 3}))
    assert all(np.array_equal(a.train, b.train) for a, b in zip(fed.holdout, again.holdout, strict=True))
    assert any(not np.array_equal(h.train, np.sort(h.train)) for h in fed.holdout)


def test_held_out_users_need_users_outside_the_federation(synth):
    with pytest.raises(DatasetError, match="5 held-out users requested but only 4 users are not training clients"):
        partition(synth, DataConfig(**{**SYNTH.__dict__, "holdout_clients": 5}))
    with pytest.raises(DatasetError, match="needs the 'user' partition"):
        load_federated(DataConfig(dataset="digits", num_clients=3, holdout_clients=1))
    with pytest.raises(ConfigError, match="--holdout-clients must be >= 0"):
        DataConfig(holdout_clients=-1)


@pytest.mark.numeric
def test_same_seed_same_curve_and_n0_is_the_received_model(initial, users, monkeypatch):
    sizes = (0, 5, 10)
    a = fine_tuning_curve(MODEL, initial, None, users, sizes, TRAINING, 3, seed=3)
    scored: list[dict[str, torch.Tensor]] = []  # the weights each point of the curve scored

    def evaluate_and_keep(trainer, x, y):  # type: ignore[no-untyped-def]
        scored.append(trainer.get_tensors(trainer.names))
        return evaluate(trainer, x, y)

    monkeypatch.setattr(fine_tuning, "evaluate", evaluate_and_keep)
    b = fine_tuning_curve(MODEL, initial, None, users, sizes, TRAINING, 3, seed=3)
    assert a == b
    assert set(a) == {0, 5, 10} and all(len(a[n]) == 3 for n in sizes)
    trainer = EagerTrainer(build_model(MODEL))
    trainer.set_tensors(initial)
    assert a[0] == {u: evaluate(trainer, user.x_test, user.y_test) for u, user in enumerate(users)}
    # N=0 scores the received weights; every N > 0 trained them first. Checked on the weights,
    # not on the scores: a near-chance model may score the same after training (issue 25).
    assert len(scored) == 3 * len(sizes)  # user by user, N by N
    for u in range(3):
        received, *trained = scored[u * len(sizes) : (u + 1) * len(sizes)]
        assert all(torch.equal(received[n], initial[n]) for n in received)
        assert all(not torch.equal(t["classifier.weight"], initial["classifier.weight"]) for t in trained)


def test_head_only_fine_tuning_leaves_the_base_bit_identical(initial, users):
    model = build_model(MODEL)
    s = split(model, 2)
    trainer = EagerTrainer(model, trainable=s.head)
    trainer.set_tensors(initial)
    fine_tune(trainer, users[0].x_pool[:10], users[0].y_pool[:10], TRAINING, 4, np.random.default_rng(0))
    after = trainer.get_tensors(s.names)
    assert all(torch.equal(after[n], initial[n]) for n in s.base)
    assert not torch.equal(after["classifier.weight"], initial["classifier.weight"])
    # A trainer of every tensor on the same model trains the base again.
    everything = EagerTrainer(model)
    everything.start_round(0.01, 0.9)
    everything.train_step(users[0].x_pool[:8], users[0].y_pool[:8])
    assert not torch.equal(
        everything.get_tensors(["stem.conv.weight"])["stem.conv.weight"], initial["stem.conv.weight"]
    )


def test_a_pool_smaller_than_n_leaves_the_user_out_of_that_n(initial, users):
    big = max(len(u.y_pool) for u in users)
    small = min(len(u.y_pool) for u in users)
    assert small < big
    curve = fine_tuning_curve(MODEL, initial, None, users, (0, big, big + 1), TRAINING, 1, seed=0)
    assert len(curve[0]) == 3 and len(curve[big]) == 1 and curve[big + 1] == {}
    summary = curve_summary(curve)
    assert summary[str(big)]["users"] == 1 and summary[str(big)]["se"] is None
    assert summary[str(big + 1)] == {"users": 0}
    with pytest.raises(ConfigError, match="0 or at least 2 photos"):
        fine_tuning_curve(MODEL, initial, None, users, (0, 1), TRAINING, 1, seed=0)


def test_majority_of_the_first_n_ratings():
    x = torch.zeros(6, 3, 32, 32)
    user = NewUser(x, torch.tensor([2, 1, 1, 2, 2, 2]), x[:4], torch.tensor([1, 1, 2, 0]))
    curve = majority_curve([user], (0, 3, 6))
    assert curve == {0: {}, 3: {0: 0.5}, 6: {0: 0.25}}


def test_a_received_base_replaces_the_initial_tensors(initial):
    s = split(build_model(MODEL), 2)
    base = {n: np.full(tuple(initial[n].shape), 0.5, np.float32) for n in s.base if not n.endswith("running_var")}
    start = with_base(initial, base)
    assert torch.equal(start["stem.conv.weight"], torch.full_like(initial["stem.conv.weight"], 0.5))
    assert torch.equal(start["classifier.weight"], initial["classifier.weight"])
    # What the base lacks (here: its BatchNorm variances, as with --bn local) the new user trains.
    trained = set(personal_names(s, base))
    assert trained == set(s.head) | {n for n in s.base if n.endswith("running_var")}
    with pytest.raises(WeightsError, match="does not have"):
        with_base(initial, {"nope": np.zeros(1, np.float32)})
    with pytest.raises(WeightsError, match="shape"):
        with_base(initial, {"stem.conv.weight": np.zeros(1, np.float32)})
    with pytest.raises(WeightsError, match="lack"):
        fine_tuning_curve(MODEL, base, None, [], (0,), TRAINING, 1, seed=0)


@pytest.mark.slow
def test_simulate_with_held_out_users_records_and_plots_their_curve(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["simulate", "--dataset", "aesthetic-synth", "--clients", "3", "--users", "5", "--holdout-clients", "2",
            "--images-per-user", "20-30", "--rounds", "1", "--local-epochs", "1", "--algorithms", "fedper,fedavg",
            "--threads", "1", "--fine-tune-steps", "2", "--seed", "1", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    new = results["new_users"]
    assert results["config"]["data"]["holdout_clients"] == 2
    assert set(new["curves"]) == {"fedper: head", "fedper: head+base", "fedavg: head", "scratch", "majority of N"}
    assert new["sizes"] == [0, 5, 10, 20, 50, 100] and new["steps"] == 2 and len(new["users"]) == 2
    # Pools of 16-24 photos: N=20 covers only the users with at least 20, N=50 none.
    assert new["curves"]["scratch"]["5"]["users"] == 2
    assert new["curves"]["scratch"]["20"]["users"] == sum(p >= 20 for p in new["pool_sizes"])
    assert new["curves"]["scratch"]["50"] == {"users": 0}
    assert len(new["curves"]["fedper: head"]["0"]["per_user"]) == 2
    assert (out / "new_users.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "new users" in capsys.readouterr().out


@settings(max_examples=60, deadline=None)
@given(labels=st.lists(st.integers(0, 4), max_size=60), kind=st.sampled_from(HEADS))
def test_a_head_at_its_rating_prior_predicts_the_user_frequencies_whatever_the_features(labels, kind):
    head = classifier(kind, 16, 5)
    y = torch.tensor(labels, dtype=torch.long)
    head.load_state_dict(rating_prior(head, y, 5))
    counts = np.bincount(labels, minlength=5)
    expected = (counts + 1) / (counts.sum() + 5)  # add-one: every rating stays possible
    with torch.no_grad():
        out = torch.log_softmax(head(torch.randn(7, 16) * 10), 1).double().exp()
    assert torch.allclose(out, torch.from_numpy(expected)[None].expand(7, 5), atol=1e-5)
    if labels and (counts == counts.max()).sum() == 1:  # a unique majority is the prediction
        assert out.argmax(1).eq(int(counts.argmax())).all()


def test_rating_prior_refuses_ratings_outside_the_classes():
    head = classifier("ordinal", 4, 5)
    with pytest.raises(ConfigError, match="classes 0..4"):
        rating_prior(head, torch.tensor([0, 5]), 5)
    with pytest.raises(ConfigError, match="classes 0..4"):
        rating_prior(head, torch.tensor([[1]]), 5)
    with pytest.raises(ConfigError, match="no rating prior"):
        rating_prior(torch.nn.Linear(4, 5, bias=False), torch.tensor([1]), 5)


@pytest.mark.parametrize("head", HEADS)
def test_a_fresh_head_starts_each_new_user_at_its_own_majority(users, head, monkeypatch):
    """Untrained (fine-tuning skipped), a fresh head set from the first N ratings scores exactly
    what the majority of those N ratings scores; without the prior, it does not."""
    model = dataclasses.replace(MODEL, head=head)
    start = exchanged_state(build_model(model, seed=3))
    monkeypatch.setattr(fine_tuning, "fine_tune", lambda *args: 0.0)
    sizes = (5, 10, 20)
    primed = fine_tuning_curve(model, start, None, users, sizes, TRAINING, 1, seed=0, fresh_head=True)
    plain = fine_tuning_curve(model, start, None, users, sizes, TRAINING, 1, seed=0)
    majority = majority_curve(users, sizes)
    unique = [(n, u) for n in sizes for u, user in enumerate(users)
              if n <= len(user.y_pool) and (c := torch.bincount(user.y_pool[:n])).eq(c.max()).sum() == 1]  # fmt: skip
    assert len(unique) >= 5
    assert all(primed[n][u] == majority[n][u] for n, u in unique)
    assert any(plain[n][u] != majority[n][u] for n, u in unique)
