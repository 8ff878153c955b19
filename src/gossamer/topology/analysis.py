"""Spectral analysis (Kong et al. 2021, section B of papers.md): with J = 11^T/n and
period P, the spectral gap is

    rho = 1 - || W_{P-1} ... W_0 - J ||_2 ^ (1/P),

which for a static symmetric W is 1 - max(|lambda_2|, |lambda_n|). The mixing
quality is p = 1 - (1 - rho)^2, and the slowest mode halves in
ln 2 / (-ln(1 - rho)) rounds.

Beside the spectral gap, :func:`analyse` reports the expected contraction E‖W_t − J‖²
(:func:`expected_contraction`) and Vogels et al.'s effective number of neighbours
(:func:`effective_neighbours`; docs/topologies.md). Pure numpy (+ scipy for sparse spectra); no torch.
"""

from __future__ import annotations

import math

import numpy as np

from ..registry import short
from .build import Topology, check_fits
from .mixing import DENSE_MAX, TOL, Mixing, TopologyError, norm_minus_mean

DENSE_BYTES = 80  # per entry of the n×n matrices of a directed topology's spectrum (W_t, their product, eigenvectors)


def _norm_minus_mean(mixings: tuple[Mixing, ...]) -> float:
    """‖W_{P−1} ⋯ W_0 − J‖₂ (:func:`~gossamer.topology.mixing.norm_minus_mean`), dense up to this
    module's DENSE_MAX."""
    return norm_minus_mean(mixings, DENSE_MAX)


def _log_norm_minus_mean(mixings: tuple[Mixing, ...]) -> float:
    """ln ‖Π_t (W_t − J)‖₂ over many rounds of doubly stochastic W_t (dense, n ≤ DENSE_MAX): the
    product is taken on the mean-free part and rescaled after every round, so that a long product
    of contractions neither underflows nor drowns in the rounding of W − J; −inf once a round
    leaves nothing (an exact average)."""
    n = mixings[0].n
    P = (np.eye(n) - 1.0 / n) / math.sqrt(n - 1)  # ‖I − J‖_F = √(n − 1)
    log = 0.5 * math.log(n - 1)
    for m in mixings:
        P = m.sparse() @ P
        P -= P.mean(0, keepdims=True)  # (W − J) P = W P − J P; 1ᵀP = 0 up to rounding
        size = float(np.linalg.norm(P))
        if size <= TOL:
            return -math.inf
        log += math.log(size)
        P /= size
    return log + math.log(float(np.linalg.norm(P, 2)))


def _norm_minus_limit(mixings: tuple[Mixing, ...]) -> float:
    """‖W_{P−1} ⋯ W_0 − π1ᵀ‖₂ for column-stochastic W (dense): π the Perron vector of the product,
    P π = π with Σπ = 1, the limit of its powers that push-sum divides out."""
    n = mixings[0].n
    prod = np.eye(n)
    for m in mixings:
        prod = m.dense() @ prod
    values, vectors = np.linalg.eig(prod)
    pi = np.real(vectors[:, np.argmin(np.abs(values - 1))])
    return float(np.linalg.norm(prod - np.outer(pi / pi.sum(), np.ones(n)), 2))


def spectral_gap(topology: Topology) -> float:
    """rho = 1 - ||W_{P-1} ... W_0 - J||_2^(1/P), clipped to [0, 1]. J = 11^T/n, the limit of the
    products of doubly stochastic W; for a directed topology J = pi 1^T (:func:`_norm_minus_limit`).
    A random topology's is the empirical one over its P sampled rounds (``topology.period``)."""
    if topology.n == 1:
        return 1.0
    if topology.random and topology.n <= DENSE_MAX:
        log = _log_norm_minus_mean(topology.mixings)
        return float(min(1.0, max(0.0, 1.0 - math.exp(log / topology.period))))
    if not topology.doubly_stochastic:
        check_fits(f"the spectral gap of directed topology '{short(topology.name)}' (dense)", topology.n,
                    lambda n: DENSE_BYTES * n * n)
    norm = _norm_minus_mean if topology.doubly_stochastic else _norm_minus_limit
    rho = 1.0 - norm(topology.mixings) ** (1.0 / topology.period)
    return float(min(1.0, max(0.0, rho)))


DECAY = 0.95  # γ of the effective number of neighbours: noise is averaged over about 1/(1 − γ) = 20 rounds


def _check_decay(decay: float) -> float:
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 <= decay < 1.0:
        raise TopologyError(f"the decay γ of the effective number of neighbours must be in [0, 1), got {decay!r}")
    return float(decay)


def _circulant_spectra(topology: Topology) -> np.ndarray | None:
    """|λ_{t,m}|² [P, n − 1] of the rounds' circulant W_t off the mean mode (None unless all are)."""
    spectra = [m.spectrum for m in topology.mixings]
    if any(s is None for s in spectra):
        return None
    return np.abs(np.stack(spectra))[:, 1:] ** 2


def expected_contraction(topology: Topology) -> float | None:
    """‖E_t[(W_t − J)ᵀ(W_t − J)]‖₂: the factor 1 − p by which a round shrinks the disagreement in
    expectation, E‖X W_t − X̄‖²_F ≤ (1 − p)‖X − X̄‖²_F (Koloskova et al. 2020's assumption on
    random and time-varying W_t). E is the mean over the period; for a static W it is
    ‖W − J‖₂² = (1 − ρ)². For a random topology it is estimated from its sampled rounds, averaged
    over the relabellings that leave the law of W_t unchanged (:func:`_random_modes`); it is 1
    for a one-peer round taken alone (some mode stays unmixed), yet below 1 in expectation. None
    for a directed topology (its limit is not J)."""
    n = topology.n
    if not topology.doubly_stochastic:
        return None
    if n == 1:
        return 0.0
    if topology.period == 1 and not topology.random:
        return (1.0 - spectral_gap(topology)) ** 2
    if topology.random and topology.symmetry is not None:
        modes = _random_modes(topology)
        if modes is None:
            return None
        return float(modes if np.isscalar(modes) else modes.sum(0).max())  # E[WᵀW] − J: column sums of K
    squares = _circulant_spectra(topology)
    if squares is not None:
        return float(squares.mean(0).max())
    mean = sum(m.sparse().T @ m.sparse() for m in topology.mixings) / topology.period
    if n <= DENSE_MAX:
        return float(max(0.0, np.linalg.eigvalsh(mean.toarray() - 1.0 / n)[-1]))
    from scipy.sparse.linalg import LinearOperator, eigsh

    def apply(x):
        x = np.asarray(x, dtype=np.float64).reshape(n, -1)
        x = x - x.mean(0, keepdims=True)
        y = mean @ x
        return y - y.mean(0, keepdims=True)
    op = LinearOperator((n, n), matvec=apply, dtype=np.float64)
    start = np.random.default_rng(0).standard_normal(n)
    return float(max(0.0, eigsh(op, k=1, which="LA", return_eigenvectors=False, v0=start)[0]))


def _random_modes(topology: Topology) -> float | np.ndarray | None:
    """What a random topology's symmetry makes of the expectations over its sampled rounds.

    "exchangeable" (the law of W_t is invariant under every relabelling): E[(W − J)ᵀ(W − J)] and
    E[(W − J)(W − J)ᵀ] commute with every permutation, so both are c (I − J) with
    c = E‖W_t − J‖²_F / (n − 1); returns c, estimated from the sample's Frobenius
    norms (exact for a random matching, whose every round has the same norm).
    "cyclic" (invariant under the rotations i → i + c): in the Fourier basis f_m of the
    rotations, A_t = F* W_t F, returns K with K[m', m] = E|A_t[m', m]|² over the sample,
    on the modes m, m' ≠ 0: E[W D Wᵀ] for a circulant D = F diag(δ) F* is circulant with
    eigenvalues K δ, and E[Wᵀ W] − J has eigenvalues the column sums of K (dense: None for
    n > DENSE_MAX)."""
    n, sample = topology.n, topology.mixings
    if topology.symmetry == "exchangeable":
        squares = [float((m.sparse().data ** 2).sum()) for m in sample]  # csr sums duplicate slots
        return float(np.mean(squares) - 1.0) / (n - 1)
    if topology.symmetry == "cyclic":
        if n > DENSE_MAX:
            return None
        K = np.zeros((n - 1, n - 1))
        for m in sample:
            A = np.fft.ifft(np.fft.fft(m.dense(), axis=1), axis=0)  # F* W F, F_jm = exp(−2πi jm/n)/√n
            K += np.abs(A[1:, 1:]) ** 2
        return K / len(sample)
    raise ValueError(f"unknown symmetry {topology.symmetry!r}")


def effective_neighbours(topology: Topology, decay: float = DECAY) -> float | None:
    """Vogels, Hendrikx, Jaggi's effective number of neighbours n_W(γ) (NeurIPS 2022, "Beyond
    spectral gap"), in its learning-rate-free form: in the random walk x ← W_t (√γ x + ξ_t), one
    scalar per worker and ξ_t i.i.d. standard normal noise, a worker's model averages the noise
    of the last ~1/(1 − γ) rounds; alone (W = I) its variance is 1/(1 − γ), with the exact
    average 1/(n(1 − γ)). n_W(γ) = (1/(1 − γ)) / (mean over workers of its stationary variance):
    how many workers' noise a model averages, 1 for I, n for J (for every γ), in between for a
    graph; higher means a worker's model is closer to the average over the horizon. γ ∈ [0, 1)
    is the decay: small learning rates correspond to γ near 1 (where every connected graph tends
    to n), large ones to small γ (where only the direct neighbours count).

    Computed as n / (1 + (1 − γ)·tr D), D the covariance's part off the mean mode, which follows
    D ← γ W D Wᵀ + W Wᵀ − J: in closed form per Fourier mode for circulant W_t (static or
    periodic: ring, exponential graphs, any n), from the eigenvalues for a static symmetric W,
    else by iterating D to its stationary cycle (periodic W_t: the mean over the phases of the
    period). For a random topology, E[D] over the law of W_t from its symmetry
    (:func:`_random_modes`): exchangeable, E[D] = d (I − J) with d = c / (1 − γc); invariant under
    rotations, E[D] circulant with eigenvalues δ = (I − γK)⁻¹ K 1 — estimates from the sampled
    rounds; without a symmetry, by iterating D along drawn rounds (a burn-in of ln 10⁻⁸ / ln γ
    rounds, then the mean over as many rounds as the sample). None for a directed topology, and
    for graphs that are not circulant with n > DENSE_MAX."""
    gamma = _check_decay(decay)
    n = topology.n
    if not topology.doubly_stochastic:
        return None
    if n == 1:
        return 1.0
    if topology.random and topology.symmetry is not None:
        modes = _random_modes(topology)
        if modes is None:
            return None
        if np.isscalar(modes):  # exchangeable: E[D] = d (I − J), d = γ c d + c
            return n / (1 + (1 - gamma) * (n - 1) * modes / (1 - gamma * modes))
        # cyclic: E[D] circulant with eigenvalues δ = γ K δ + K 1 (E[W Wᵀ] − J has eigenvalues K 1)
        delta = np.linalg.solve(np.eye(n - 1) - gamma * modes, modes.sum(1))
        return n / (1 + (1 - gamma) * float(delta.sum()))
    squares = None if topology.random else _circulant_spectra(topology)
    if squares is not None:  # per mode m: d ← |λ_{t,m}|² (γ d + 1)
        shrink, offset = np.ones(n - 1), np.zeros(n - 1)
        for a in squares:  # one period as one affine map d ← shrink·d + offset
            shrink, offset = a * gamma * shrink, a * (gamma * offset + 1)
        d, total = offset / (1 - shrink), 0.0
        for a in squares:
            d = a * (gamma * d + 1)
            total += float(d.sum())
        return n / (1 + (1 - gamma) * total / len(squares))
    if n > DENSE_MAX:
        return None
    if topology.period == 1 and not topology.random:
        w = topology.mixings[0].dense()
        if np.allclose(w, w.T, rtol=0, atol=TOL):
            mu = np.linalg.eigvalsh(w - 1.0 / n) ** 2
            return n / (1 + (1 - gamma) * float((mu / (1 - gamma * mu)).sum()))
    return n / (1 + (1 - gamma) * _iterated_trace(topology, gamma))


def _iterated_trace(topology: Topology, gamma: float) -> float:
    """tr D of :func:`effective_neighbours` by iterating D ← γ W_t D W_tᵀ + W_t W_tᵀ − J from 0."""
    n, P = topology.n, topology.period
    D = np.zeros((n, n))

    def step(m: Mixing) -> float:
        nonlocal D
        w = m.sparse()
        WD = w @ D
        D = gamma * (w @ WD.T).T + (w @ w.T).toarray() - 1.0 / n
        D = (D + D.T) / 2
        return float(np.trace(D))
    burn = 0 if gamma == 0 else min(100_000, math.ceil(math.log(1e-8) / math.log(gamma)))
    if topology.random:
        for t in range(burn):
            step(topology.mixing(t))
        return float(np.mean([step(topology.mixing(t)) for t in range(burn, burn + P)]))
    previous = None
    for cycle in range(burn // P + 2):  # the stationary cycle: D after a period stops changing
        traces = [step(m) for m in topology.mixings]
        if previous is not None and abs(traces[-1] - previous) <= 1e-12 * (1 + abs(previous)):
            break
        previous = traces[-1]
    return float(np.mean(traces))


def analyse(topology: Topology, decay: float = DECAY) -> dict:
    """Summary: the kind (static, time-varying or random), spectral gap rho over ``gap_rounds``
    rounds (1, the period, or a random topology's sampled rounds: the empirical gap),
    p = 1 - (1 - rho)^2, rounds to halve the slowest mode ln 2 / (-ln(1 - rho)) (0 if rho = 1,
    inf if rho = 0), mean messages per worker per round over those rounds, the expected
    contraction E‖W_t − J‖² (:func:`expected_contraction`) and the effective number of neighbours
    at decay γ (:func:`effective_neighbours`)."""
    gamma = _check_decay(decay)
    rho = spectral_gap(topology)
    if rho >= 1.0:
        halve = 0.0
    elif rho <= 0.0:
        halve = float("inf")
    else:
        halve = math.log(2.0) / -math.log1p(-rho)
    msgs = float(np.mean([m.messages_per_worker for m in topology.mixings]))
    return {
        "name": topology.name,
        "n": topology.n,
        "kind": topology.kind,
        "spectral_gap": rho,
        "gap_rounds": topology.period,
        "p": 1.0 - (1.0 - rho) ** 2,
        "period": None if topology.random else topology.period,
        "rounds_to_halve": halve,
        "messages_per_worker": msgs,
        "expected_contraction": expected_contraction(topology),
        "effective_neighbours": effective_neighbours(topology, gamma),
        "decay": gamma,
    }
