"""Bayesian comparisons with a region of practical equivalence (ROPE), after Benavoli et al.
(JMLR 2017) and their ``baycomp`` package.

Both tests answer, for conditions a and b and a ROPE of half-width r: how probable is it that a
is better by more than r (``p_a``), that the two are practically equivalent (``p_rope``), that b
is better by more than r (``p_b``). As in baycomp, each posterior sample holds the three
probabilities of a new dataset's difference falling left, inside or right of the ROPE, and the
reported probability of each region is the share of samples in which that region is the most
probable (``baycomp.Posterior.probs``).

- ``signed_rank``: the Bayesian signed-rank test over per-dataset means (a Dirichlet process
  on the differences). baycomp's ``SignedRankTest`` draws the same Dirichlet weights and sums
  them in a Python loop over its 50,000 samples, slow for a report's many pairs; here the draws
  are made once for all pairs and each pair's sums are one matrix product, giving baycomp's
  numbers (checked in the tests) without the loop.
- ``hierarchical``: the hierarchical model over datasets and seeds (Corani et al., Machine
  Learning 2017): per-seed differences x_ij ~ N(delta_i, sigma_i^2), delta_i ~ t(nu, delta0,
  std0), with baycomp's priors and scaling. baycomp samples it with Stan, which needs pystan,
  httpstan and a C++ toolchain compiling the model at first use (minutes); here a Gibbs sampler
  in numpy (the t as a scale mixture of normals; nu, and its Gamma prior's parameters, by
  Metropolis steps) runs all pairs at once, with nothing to compile (8 chains × 500 draws after 300
  of burn-in; on a fixed case it agrees with baycomp's Stan fit within Monte Carlo error). One
  difference from baycomp: its noise correlation rho = 1/folds is for overlapping
  cross-validation training sets; seeds are independent trainings, so rho = 0 here.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import special as sp
from scipy import stats as st

from analysis import AnalysisError


def _winner_shares(samples: np.ndarray) -> tuple[float, float, float]:
    """Share of samples where left, rope, right is the largest (baycomp's ``Posterior.probs``)."""
    winners = np.argmax(samples, axis=-1)
    counts = np.bincount(winners.ravel(), minlength=3) / winners.size
    return float(counts[0]), float(counts[1]), float(counts[2])


@functools.lru_cache(maxsize=4)
def _dirichlet_products(n: int, prior: float, nsamples: int, random_state: int) -> np.ndarray:
    """baycomp's Dirichlet draws w (weight ``prior`` on the pseudo-observation, 1 on each of
    n − 1 differences) as the products w_i w_j, i <= j, one row per draw. They depend on n and
    the seed only, so every pair of a study shares them; each pair then costs one product."""
    weights = np.ones(n)
    weights[0] = prior
    w = np.random.RandomState(random_state).dirichlet(weights, nsamples)
    i, j = np.triu_indices(n)
    prod = w[:, i] * w[:, j]
    prod.flags.writeable = False
    return prod


def signed_rank_samples(
    a, b, rope: float = 0.0, prior: float = 0.5, nsamples: int = 50000, random_state: int | None = 0
) -> np.ndarray:
    """Posterior samples (nsamples, 3) of the Bayesian signed-rank test of b − a.

    Identical to ``baycomp.SignedRankTest.sample(a, b, rope, prior=prior, nsamples=nsamples,
    random_state=random_state)`` up to rounding: the same Dirichlet draws w (one
    pseudo-observation of weight ``prior`` at 0, then the differences), the same sums
    w^T H w of the Heaviside matrices over pairs of differences, here over the upper triangle
    of the symmetric H (off-diagonal terms twice), for all draws in one matrix product.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    diff = np.concatenate([[0.0], b - a])
    n = len(diff)
    if random_state is None:
        random_state = int(np.random.default_rng().integers(2**31))
    prod = _dirichlet_products(n, float(prior), int(nsamples), random_state)
    i, j = np.triu_indices(n)
    sums = diff[i] + diff[j]
    twice = np.where(i == j, 1.0, 2.0)
    heaviside = lambda v, t: ((v > t) + 0.5 * (v == t)) * twice  # noqa: E731
    out = np.zeros((nsamples, 3))
    if rope > 0:
        # two matrix-vector products: OpenBLAS is many times slower on a two-column product
        out[:, 0] = prod @ heaviside(-sums, 2 * rope)
        out[:, 2] = prod @ heaviside(sums, 2 * rope)
        out[:, 1] = 1 - out[:, 0] - out[:, 2]
    else:
        out[:, 2] = prod @ heaviside(sums, 0)
        out[:, 0] = 1 - out[:, 2]
    return out


def signed_rank(
    a, b, rope: float, prior: float = 0.5, nsamples: int = 50000, random_state: int | None = 0
) -> dict[str, float]:
    """P(a better by more than rope), P(within rope), P(b better) over paired per-dataset scores."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    keep = ~(np.isnan(a) | np.isnan(b))
    if keep.sum() < 2:
        return {"p_a": math.nan, "p_rope": math.nan, "p_b": math.nan, "n": int(keep.sum())}
    s = signed_rank_samples(a[keep], b[keep], rope, prior, nsamples, random_state)
    pl, pe, pr = _winner_shares(s)
    return {"p_a": pl, "p_rope": pe, "p_b": pr, "n": int(keep.sum())}


# ---------------------------------------------------------------- hierarchical model


def _gamma_above(shape, rate, low, rng):
    """Gamma(shape, rate) draws truncated to [low, inf): plain draws, and the inverse CDF for
    the few below ``low`` (the bounds here are the priors' far limits, rarely reached)."""
    g = rng.gamma(shape) / rate
    bad = g < low
    if bad.any():
        g = np.where(bad, _trunc_gamma(shape, rate, low, np.full(np.shape(g), np.inf), rng), g)
    return g


def _trunc_gamma(shape, rate, low, high, rng):
    """Gamma(shape, rate) draws truncated to [low, high], by inverting the CDF."""
    lo = sp.gammainc(shape, rate * low)
    hi = sp.gammainc(shape, rate * high) if np.isfinite(high).all() else np.ones_like(lo)
    u = lo + (hi - lo) * rng.random(np.shape(lo))
    u = np.clip(u, 1e-300, 1 - 1e-16)
    return sp.gammaincinv(shape, u) / rate


def _trunc_normal(mean, sd, low, high, rng):
    """Normal draws truncated to [low, high], by inverting the CDF."""
    a, b = sp.ndtr((low - mean) / sd), sp.ndtr((high - mean) / sd)
    u = np.clip(a + (b - a) * rng.random(np.shape(mean)), 1e-16, 1 - 1e-16)
    return mean + sd * sp.ndtri(u)


def _nu_logpost(nu_m1, alpha, beta, q, sum_log_lam, sum_lam):
    """log p(nu − 1 | ...) up to a constant: a Gamma(alpha, beta) prior and q mixing weights
    lambda_i ~ Gamma(nu/2, nu/2), given through their sums of logs and of values."""
    half = (nu_m1 + 1) / 2
    lik = q * (half * np.log(half) - sp.gammaln(half)) + (half - 1) * sum_log_lam - half * sum_lam
    return (alpha - 1) * np.log(nu_m1) - beta * nu_m1 + lik


NO_DATASETS = (
    "needs two or more datasets with two or more paired seeds (seeds finished for both conditions at their chosen lrs)"
)
NO_SPREAD = "not run: the paired seed differences have no spread (each dataset's seeds differ by the same amount)"


def hierarchical_skip(x: np.ndarray, y: np.ndarray) -> str | None:
    """Why the hierarchical test cannot run on paired seed scores x, y (D, S), or None if it can."""
    d = np.asarray(y, float) - np.asarray(x, float)
    rows = [r[~np.isnan(r)] for r in d]
    rows = [r for r in rows if len(r) >= 2]
    if len(rows) < 2:
        return NO_DATASETS
    if float(np.mean([np.std(r) for r in rows])) == 0:
        return NO_SPREAD
    return None


def hierarchical_stats(x: np.ndarray, y: np.ndarray, rope: float, random_state: int = 0):
    """Scaled sufficient statistics of paired seed scores x, y of shape (D, S) for one pair.

    Differences y − x are scaled by their mean within-dataset std (baycomp's scaling, so the
    priors are on one scale whatever the accuracy unit). A dataset whose paired differences
    are all equal gets them replaced by ±uniform(−rope, rope) pairs, as baycomp does to avoid a
    zero variance. Datasets with fewer than two paired seeds are left out. Returns None when
    fewer than two datasets remain or the differences have no spread at all (``hierarchical_skip``).
    """
    if hierarchical_skip(x, y) is not None:
        return None
    rng = np.random.RandomState(random_state)
    d = np.asarray(y, float) - np.asarray(x, float)
    rows = [r[~np.isnan(r)] for r in d]
    rows = [r for r in rows if len(r) >= 2]
    std_diff = float(np.mean([np.std(r) for r in rows]))
    rope_s = rope / std_diff
    out = []
    for r in rows:
        r = r / std_diff
        if np.var(r) == 0:
            h = len(r) // 2
            r = r.copy()
            r[:h] = rng.uniform(-rope_s, rope_s, h)
            r[h : 2 * h] = -r[:h]
        out.append(r)
    n = np.array([len(r) for r in out], float)
    mean = np.array([r.mean() for r in out])
    ss = np.array([((r - r.mean()) ** 2).sum() for r in out])
    std_within = float(np.mean([np.std(r) for r in out]))
    return {
        "n": n,
        "mean": mean,
        "ss": ss,
        "rope": rope_s,
        "scale": std_diff,
        "max_abs": float(max(np.abs(r).max() for r in out)),
        "std_within": std_within,
        "std_among": float(np.std(mean)),
    }


@dataclass
class _Data:
    """All pairs' sufficient statistics, padded to (chains × pairs, datasets) arrays (datasets a
    pair lacks masked out), with per-chain counts and the priors' bounds."""

    mask: np.ndarray
    n: np.ndarray
    xbar: np.ndarray
    ss: np.ndarray
    q: np.ndarray
    d_hi: np.ndarray
    s_hi: np.ndarray
    s0_hi: np.ndarray
    std_among: np.ndarray
    std_within: np.ndarray


def _padded(data: list[dict], chains: int, upper_sigma: float) -> _Data:
    """``hierarchical_stats`` results tiled ``chains`` times, padded to the most datasets."""
    P, Q = len(data), max(len(t["n"]) for t in data)

    def pad(key, fill):
        a = np.full((P, Q), fill, float)
        for p, t in enumerate(data):
            a[p, : len(t[key])] = t[key]
        return np.tile(a, (chains, 1))

    per = lambda key: np.tile(np.array([t[key] for t in data], float), chains)  # noqa: E731
    mask = pad("n", 0.0) > 0
    q = mask.sum(axis=1).astype(float)
    s0_hi = np.where(q > 1, per("std_among"), per("std_within")) * upper_sigma
    return _Data(
        mask=mask,
        n=np.where(mask, pad("n", 2.0), 2.0),
        xbar=pad("mean", 0.0),
        ss=np.where(mask, pad("ss", 1.0), 1.0),
        q=q,
        d_hi=per("max_abs"),
        s_hi=per("std_within") * upper_sigma,
        s0_hi=np.maximum(s0_hi, 1e-12),
        std_among=per("std_among"),
        std_within=per("std_within"),
    )


@dataclass
class _Chains:
    """The Gibbs sampler's state, one row per chain."""

    delta: np.ndarray
    delta0: np.ndarray
    std0: np.ndarray
    sigma2: np.ndarray
    lam: np.ndarray
    nu_m1: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray


def _start(m: _Data) -> _Chains:
    """delta_i at the dataset means, delta0 at their mean, std0 and sigma_i at the spreads."""
    B, Q = m.xbar.shape
    return _Chains(
        delta=m.xbar.copy(),
        delta0=np.clip((m.xbar * m.mask).sum(axis=1) / m.q, -m.d_hi, m.d_hi),
        std0=np.maximum(m.std_among, 0.1 * m.std_within) + 1e-6,
        sigma2=np.where(m.mask, m.ss / np.maximum(m.n - 1, 1), 1.0) + 1e-12,
        lam=np.ones((B, Q)),
        nu_m1=np.full(B, 5.0),
        alpha=np.full(B, 1.5),
        beta=np.full(B, 0.05),
    )


def _step_means(c: _Chains, m: _Data, rng) -> None:
    """One Gibbs sweep over delta_i, sigma_i, lambda_i, delta0 and std0, in place."""
    mask, n, xbar = m.mask, m.n, m.xbar
    # delta_i | rest: normal, data precision n/sigma^2 and prior precision lambda/std0^2
    prior_prec = c.lam / c.std0[:, None] ** 2
    prec = np.where(mask, n / c.sigma2, 0.0) + prior_prec
    mu = (np.where(mask, n * xbar / c.sigma2, 0.0) + prior_prec * c.delta0[:, None]) / prec
    c.delta = mu + rng.standard_normal(xbar.shape) / np.sqrt(prec)
    # sigma_i^2 | rest: 1/sigma^2 ~ Gamma((n-1)/2, S/2), sigma uniform on (0, s_hi)
    s_i = m.ss + n * (xbar - c.delta) ** 2
    tau = _gamma_above((n - 1) / 2, s_i / 2, 1 / m.s_hi[:, None] ** 2, rng)
    c.sigma2 = np.where(mask, 1 / tau, 1.0)
    # lambda_i | rest: the t's mixing weights
    z2 = (c.delta - c.delta0[:, None]) ** 2 / c.std0[:, None] ** 2
    c.lam = rng.gamma((c.nu_m1[:, None] + 2) / 2) / ((c.nu_m1[:, None] + 1 + z2) / 2)
    # delta0 | rest: normal truncated to (−max|x|, max|x|), uniform prior
    wsum = (c.lam * mask).sum(axis=1)
    c.delta0 = _trunc_normal((c.lam * c.delta * mask).sum(axis=1) / wsum, c.std0 / np.sqrt(wsum), -m.d_hi, m.d_hi, rng)
    # std0 | rest: 1/std0^2 ~ Gamma((q-1)/2, sum lambda (delta-delta0)^2 / 2), std0 uniform
    s0 = (c.lam * (c.delta - c.delta0[:, None]) ** 2 * mask).sum(axis=1)
    tau0 = _gamma_above(np.maximum(m.q - 1, 0.5) / 2, s0 / 2, 1 / m.s0_hi**2, rng)
    c.std0 = 1 / np.sqrt(tau0)


def _step_nu(c: _Chains, m: _Data, rng, alpha_range, beta_range) -> None:
    """One Metropolis-within-Gibbs sweep over nu and its Gamma prior's alpha and beta, in place."""
    B = len(c.nu_m1)
    # nu − 1 | lambda, alpha, beta: random-walk Metropolis on its log (+ u: the Jacobian)
    u = np.log(c.nu_m1)
    prop = u + 0.5 * rng.standard_normal(B)
    sl, sv = (np.log(c.lam) * m.mask).sum(axis=1), (c.lam * m.mask).sum(axis=1)
    cur = _nu_logpost(c.nu_m1, c.alpha, c.beta, m.q, sl, sv) + u
    new = _nu_logpost(np.exp(prop), c.alpha, c.beta, m.q, sl, sv) + prop
    accept = np.log(rng.random(B)) < new - cur
    c.nu_m1 = np.where(accept, np.exp(prop), c.nu_m1)
    # alpha | nu, beta: independence Metropolis from its uniform prior
    prop_a = rng.uniform(*alpha_range, B)
    la = lambda a: a * np.log(c.beta) + (a - 1) * np.log(c.nu_m1) - sp.gammaln(a)  # noqa: E731
    c.alpha = np.where(np.log(rng.random(B)) < la(prop_a) - la(c.alpha), prop_a, c.alpha)
    # beta | alpha, nu: Gamma(alpha + 1, nu − 1) truncated to its prior's range
    c.beta = _trunc_gamma(c.alpha + 1, c.nu_m1, np.full(B, beta_range[0]), np.full(B, beta_range[1]), rng)


def hierarchical_samples(
    data: list[dict],
    draws: int = 500,
    burn: int = 300,
    chains: int = 8,
    random_state: int = 0,
    upper_sigma: float = 1000.0,
    alpha_range=(1.0, 2.0),
    beta_range=(0.01, 0.1),
) -> dict[str, np.ndarray]:
    """Gibbs samples of (delta0, std0, nu) for several pairs at once, each pair its own model.

    ``data`` holds one ``hierarchical_stats`` result per pair. The chains of all pairs advance
    together on (chains × pairs, datasets) arrays; datasets a pair lacks are masked out. Returns
    arrays of shape (pairs, chains × draws) for ``delta0``, ``std0`` and ``nu``.
    """
    rng = np.random.default_rng(random_state)
    P = len(data)
    m = _padded(data, chains, upper_sigma)
    c = _start(m)
    keep = {k: np.empty((chains * P, draws)) for k in ("delta0", "std0", "nu")}
    for it in range(burn + draws):
        _step_means(c, m, rng)
        _step_nu(c, m, rng, alpha_range, beta_range)
        if it >= burn:
            keep["delta0"][:, it - burn] = c.delta0
            keep["std0"][:, it - burn] = c.std0
            keep["nu"][:, it - burn] = c.nu_m1 + 1
    # (chains × pairs, draws) → (pairs, chains × draws)
    return {k: v.reshape(chains, P, draws).transpose(1, 0, 2).reshape(P, chains * draws) for k, v in keep.items()}


def hierarchical(
    pairs: list[tuple[np.ndarray, np.ndarray]],
    rope: float,
    draws: int = 500,
    burn: int = 300,
    chains: int = 8,
    random_state: int = 0,
) -> list[dict[str, float]]:
    """The hierarchical test of each (x, y) pair of (datasets, seeds) score arrays.

    Returns per pair P(x better), P(rope), P(y better) (``p_a``, ``p_rope``, ``p_b``), the
    posterior mean of the mean difference y − x in the input's unit (``delta0``), and
    ``datasets``, how many had two or more paired seeds; NaN where the pair has fewer than two
    such datasets or no spread, with ``skipped`` saying which (empty where it ran).
    """
    if rope < 0:
        raise AnalysisError(f"the ROPE half-width must be >= 0, got {rope}")
    prepared = [hierarchical_stats(x, y, rope, random_state) for x, y in pairs]
    ok = [i for i, t in enumerate(prepared) if t is not None]
    out = [
        {
            "p_a": math.nan,
            "p_rope": math.nan,
            "p_b": math.nan,
            "delta0": math.nan,
            "datasets": 0 if t is None else len(t["n"]),
            "skipped": "" if t is not None else hierarchical_skip(x, y),
        }
        for t, (x, y) in zip(prepared, pairs)
    ]
    if not ok:
        return out
    data = [prepared[i] for i in ok]
    s = hierarchical_samples(data, draws, burn, chains, random_state)
    for p, i in enumerate(ok):
        r = data[p]["rope"]
        mu, sd, nu = s["delta0"][p], s["std0"][p], s["nu"][p]
        left = st.t.cdf(-r, nu, mu, sd)
        right = st.t.sf(r, nu, mu, sd)
        pl, pe, pr = _winner_shares(np.stack([left, 1 - left - right, right], axis=1))
        out[i].update(p_a=pl, p_rope=pe, p_b=pr, delta0=float(mu.mean() * data[p]["scale"]))
    return out


__all__ = ["signed_rank", "signed_rank_samples", "hierarchical", "hierarchical_stats", "hierarchical_samples"]
