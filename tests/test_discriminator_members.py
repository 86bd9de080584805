"""The discriminator as a deep ensemble (`discriminator_members`): each member trained on its own conditional
bound, the prediction the members' mixture, checked against torch.distributions and a member alone."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from falsevfl_secure.bounds import conditional_bound
from falsevfl_secure.model import ActiveModel


def _model(members: int, task: str, seed: int, own: int = 0) -> ActiveModel:
    torch.manual_seed(seed)  # test weights only: a party's real weights come from its secret stream
    return ActiveModel(4, 2, 8, 3, 6, task, own_inputs=own, members=members)


@settings(max_examples=25, deadline=None)
@given(members=st.integers(2, 5), samples=st.integers(1, 4), rows=st.integers(1, 6),
       scale=st.sampled_from([1e-2, 1.0, 30.0]), seed=st.integers(0, 2**16))
def test_the_prediction_is_the_members_mixture(members, samples, rows, scale, seed):
    h = torch.randn(samples, rows, 4, dtype=torch.float64) * scale
    for task in ("classification", "regression"):
        model = _model(members, task, seed).double()
        mixed = model.label_distribution(h)
        outs = [member(h) for member in model.discriminator.members]
        if task == "classification":
            mixture = torch.distributions.MixtureSameFamily(
                torch.distributions.Categorical(torch.full((samples, rows, members), 1.0 / members, dtype=h.dtype)),
                torch.distributions.Categorical(logits=torch.stack(outs, dim=-2)))
            labels = torch.arange(3, dtype=h.dtype).view(3, 1, 1)
            torch.testing.assert_close(mixed.log().movedim(-1, 0), mixture.log_prob(labels.expand(3, samples, rows)))
            continue
        means = torch.stack([o[..., 0] for o in outs], dim=-1)
        stds = torch.stack([torch.nn.functional.softplus(o[..., 1]) + 1e-3 for o in outs], dim=-1)
        mixture = torch.distributions.MixtureSameFamily(
            torch.distributions.Categorical(torch.full((samples, rows, members), 1.0 / members, dtype=h.dtype)),
            torch.distributions.Normal(means, stds))
        torch.testing.assert_close(mixed[..., 0], mixture.mean)
        torch.testing.assert_close(mixed[..., 1], mixture.stddev)


def test_each_member_learns_from_its_own_bound_alone():
    """The stage-2 loss is the members' mean bound, so a member's gradient is 1/M of what it would get alone:
    no member reads another's output (an ensemble of the average's loss would couple them)."""
    members, kappa, rows = 3, 5, 7
    model = _model(members, "classification", 0)
    h, y, log_w = torch.randn(kappa, rows, 4), torch.randint(0, 3, (rows,)), torch.randn(kappa, rows)
    loss = -conditional_bound(log_w, model.label_log_prob(h, y)).mean(0).mean()
    loss.backward()
    for member in model.discriminator.members:
        alone = _model(1, "classification", 0)
        alone.discriminator.load_state_dict(member.state_dict())
        own = -conditional_bound(log_w, alone.label_log_prob(h, y)[0]).mean()
        own.backward()
        for mine, theirs in zip(member.parameters(), alone.discriminator.parameters(), strict=True):
            torch.testing.assert_close(mine.grad, theirs.grad / members)
    # and the bound itself is the paper's, log (1/kappa) sum_j w_j p(y | h_j), per member
    log_p = model.label_log_prob(h, y)
    expected = torch.stack([torch.logsumexp(log_w + lp, 0) - math.log(kappa) for lp in log_p])
    torch.testing.assert_close(conditional_bound(log_w, log_p), expected)


def test_one_member_is_the_papers_discriminator_under_its_old_names():
    model = _model(1, "regression", 3, own=2)
    assert set(model.discriminator.state_dict()) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    h, own = torch.randn(4, 5, 4), torch.randn(5, 2)
    direct = model.discriminator(torch.cat([h, own.expand(4, 5, 2)], dim=-1))
    out = model.label_distribution(h, own)
    torch.testing.assert_close(out[..., 0], direct[..., 0])
    torch.testing.assert_close(out[..., 1], torch.nn.functional.softplus(direct[..., 1]) + 1e-3)
